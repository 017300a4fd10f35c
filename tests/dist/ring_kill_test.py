#!/usr/bin/env python3
"""A rank killed mid-run (label `mpi`): every rank ends within 30 s, non-zero, with no output
file and no temporary file left.

Usage: ring_kill_test.py QKV MPIEXEC [MPIEXEC FLAGS...]

Runs `MPIEXEC FLAGS -np 2 qkv attention --ring` on a problem that takes seconds, each rank
started through a shell that records its process id, and sends SIGKILL to rank 1 once both have
started and had a second to read their rows and enter the ring. mpirun must end the job: its
exit is timed from the kill.
"""
import glob
import os
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

LIMIT = 30.0


def main():
    qkv, launcher = os.path.abspath(sys.argv[1]), sys.argv[2:]
    with tempfile.TemporaryDirectory() as work:
        os.chdir(work)
        rng = np.random.default_rng(7)
        # About 3 x 10^11 flops per rank on one thread: seconds past the kill on any host here.
        for name in ("q", "k", "v"):
            np.save(name + ".npy", rng.standard_normal((4, 24576, 64), dtype=np.float32))
        rank_cmd = ('echo $$ > "pid.$OMPI_COMM_WORLD_RANK"; exec "$0" attention --ring '
                    '--threads 1 --q q.npy --k k.npy --v v.npy --out o.npy --lse l.npy')
        job = subprocess.Popen(launcher + ["-np", "2", "sh", "-c", rank_cmd, qkv],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        start = time.monotonic()
        while not (os.path.exists("pid.0") and os.path.exists("pid.1")):
            if job.poll() is not None or time.monotonic() - start > 60:
                print("FAIL: the ranks did not start (exit %s): %s" %
                      (job.returncode, job.stderr.read() if job.poll() is not None else ""))
                job.kill()
                return 1
            time.sleep(0.05)
        time.sleep(1.0)
        if job.poll() is not None:
            print("FAIL: the job ended before the kill (exit %d): the problem is too small" %
                  job.returncode)
            return 1
        with open("pid.1") as f:
            os.kill(int(f.read().strip()), signal.SIGKILL)
        killed = time.monotonic()
        try:
            _, err = job.communicate(timeout=LIMIT + 30)
        except subprocess.TimeoutExpired:
            job.kill()
            print("FAIL: mpirun still running %.0f s after rank 1 was killed" % (LIMIT + 30))
            return 1
        seconds = time.monotonic() - killed
        problems = []
        if seconds > LIMIT:
            problems.append("the job took %.1f s to end after the kill (limit %.0f)" %
                            (seconds, LIMIT))
        if job.returncode == 0:
            problems.append("mpirun exited 0 after a rank was killed")
        for leftover in ("o.npy", "l.npy"):
            if os.path.exists(leftover):
                problems.append("%s was written" % leftover)
        temps = glob.glob(".*qkv-tmp*") + glob.glob("*qkv-tmp*")
        if temps:
            problems.append("temporary files left: %s" % temps)
        for p in problems:
            print("FAIL:", p)
        if not problems:
            print("ok: the job ended %.1f s after rank 1 was killed (exit %d)" %
                  (seconds, job.returncode))
        return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
