#!/usr/bin/env python3
"""The bounded wait of qkv::dist (label `mpi`): no rank waits forever.

Usage: ring_timeout_test.py BUILD/python MPIEXEC [MPIEXEC FLAGS...]

Runs this file under `MPIEXEC FLAGS -np 2` with QKV_RING_TIMEOUT=0.5: rank 1 sleeps 6 s before
it calls qkv.ring_attention, so rank 0 waits in the ranks' first agreement past its limit. Rank
0 must print one line naming itself and what it waited for, and abort the job: mpirun ends
non-zero within 5 s (well before rank 1 wakes), without a Python traceback.
"""
import os
import subprocess
import sys
import time

SLEEP = 6.0


def rank_part(python_dir):
    sys.path.insert(0, python_dir)
    import numpy as np
    from mpi4py import MPI
    import qkv
    comm = MPI.COMM_WORLD
    if comm.Get_rank() == 1:
        time.sleep(SLEEP)
    x = np.zeros((2, 4, 8), np.float32)
    qkv.ring_attention(x, x, x, comm)
    print("rank %d: the ring returned" % comm.Get_rank())


def main():
    python_dir, launcher = sys.argv[1], sys.argv[2:]
    env = dict(os.environ, QKV_RING_TIMEOUT="0.5")
    start = time.monotonic()
    r = subprocess.run(launcher + ["-x", "QKV_RING_TIMEOUT", "-np", "2", sys.executable,
                                   os.path.abspath(__file__), "--rank", python_dir],
                       capture_output=True, text=True, timeout=60, env=env)
    seconds = time.monotonic() - start
    lines = [l for l in r.stderr.splitlines() if l.startswith("qkv:")]
    problems = []
    if r.returncode == 0:
        problems.append("mpirun exited 0")
    if seconds > 5:
        problems.append("the job took %.1f s to end (rank 1 sleeps %.0f s)" % (seconds, SLEEP))
    if len(lines) != 1 or not lines[0].startswith(
            "qkv: rank 0: waited more than 0.5 s for the ranks' agreement on errors"):
        problems.append("stderr %r: expected one line from rank 0 naming its wait" % r.stderr)
    if "Traceback" in r.stderr or "returned" in r.stdout:
        problems.append("a rank went on: stdout %r, stderr %r" % (r.stdout, r.stderr))
    for p in problems:
        print("FAIL", p)
    if not problems:
        print("ok: the job ended in %.1f s, status %d, stderr %r" % (seconds, r.returncode,
                                                                   r.stderr.strip()))
    return 1 if problems else 0


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--rank":
        rank_part(sys.argv[2])
    else:
        sys.exit(main())
