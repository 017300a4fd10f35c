#!/usr/bin/env python3
"""Ranks of one --ring job that disagree: refused in one line, nothing written (label `mpi`).

Usage: ring_agreement_test.py QKV MPIEXEC [MPIEXEC FLAGS...]

Each rank parses its own command line and may read node-local files, so two ranks can be
started with files of different shapes or with different flags. Each case runs 2 ranks under
`sh -c`, rank 1 with another file or another flag than rank 0, and must end with a non-zero
status (1: the job's inputs disagree), exactly one line on stderr, from rank 0, naming rank 1
and what differs, and no output or temporary file. Before the ranks agreed on their settings
(issue 37, item 3) a K, V, Q or X of another row count on one rank and --causal on one rank
exited 0 with a wrong answer, --grad-out on one rank died of an MPI internal error, --lse on
rank 0 alone left outputs behind. A control run, every rank reading its own copy of the same
files, must succeed.
"""
import os
import subprocess
import sys
import tempfile

import numpy as np

OUTPUTS = ("o.npy", "lse.npy", "dq.npy", "dk.npy", "dv.npy", "dx.npy")


def per_rank(launcher, qkv, rank0, rank1):
    """2 ranks, rank 0 running `qkv rank0...` and rank 1 `qkv rank1...`. A rank waiting for a
    collective its peer never joins gives up after QKV_RING_TIMEOUT (10 s here): a hang is
    a failure, not a stuck test."""
    quote = lambda args: " ".join("'%s'" % a for a in args)
    script = ('if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then exec "$0" %s; else exec "$0" %s; fi'
              % (quote(rank1), quote(rank0)))
    cmd = launcher + ["-x", "QKV_RING_TIMEOUT", "-np", "2", "sh", "-c", script, qkv]
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60,
                               env=dict(os.environ, QKV_RING_TIMEOUT="10"))
    except subprocess.TimeoutExpired as e:
        return subprocess.CompletedProcess(cmd, -1, "", "still running after 60 s: %r" % e.stderr)


def leftovers():
    return [f for f in os.listdir(".") if f in OUTPUTS or ".qkv-tmp-" in f]


def refused(r, what, expect):
    problems = []
    lines = r.stderr.strip().splitlines()
    if r.returncode != 1:
        problems.append("%s: exit status %d, expected 1" % (what, r.returncode))
    if len(lines) != 1 or not lines[0].startswith("rank 1: ") or expect not in lines[0]:
        problems.append("%s: stderr %r, expected one line 'rank 1: ...%s...'" %
                        (what, r.stderr, expect))
    left = leftovers()
    if left:
        problems.append("%s: left %s" % (what, left))
    for f in left:
        os.remove(f)
    return problems


def main():
    qkv, launcher = os.path.abspath(sys.argv[1]), sys.argv[2:]
    rng = np.random.default_rng(37)
    problems = []
    with tempfile.TemporaryDirectory() as work:
        os.chdir(work)
        f32 = lambda *shape: rng.standard_normal(shape).astype(np.float32)
        # Attention: H = 2, 16 rows, D = 8; the "_17" files one row more.
        for name, a in (("q", f32(2, 16, 8)), ("k", f32(2, 16, 8)), ("v", f32(2, 16, 8)),
                        ("q_17", f32(2, 17, 8)), ("k_17", f32(2, 17, 8)),
                        ("v_17", f32(2, 17, 8)), ("do", f32(2, 16, 8))):
            np.save(name + ".npy", a)
        for name in ("q", "k", "v"):
            np.save(name + "_copy.npy", np.load(name + ".npy"))
        # Layer: X [16, 12] (and one of 17 rows), H = 2, W^Q/K/V [12, 8], dY [16, 8].
        for name, a in (("x", f32(16, 12)), ("x_17", f32(17, 12)), ("wq", f32(12, 8)),
                        ("wk", f32(12, 8)), ("wv", f32(12, 8)), ("dy", f32(16, 8))):
            np.save(name + ".npy", a)

        att = ["attention", "--ring", "--q", "q.npy", "--k", "k.npy", "--v", "v.npy",
               "--out", "o.npy"]
        lay = ["layer", "--ring", "--x", "x.npy", "--wq", "wq.npy", "--wk", "wk.npy", "--wv",
               "wv.npy", "--heads", "2", "--out", "o.npy"]

        # Control: node-local copies of the same tensors (other paths) agree.
        r = per_rank(launcher, qkv, att, ["attention", "--ring", "--q", "q_copy.npy", "--k",
                                          "k_copy.npy", "--v", "v_copy.npy", "--out", "o.npy"])
        if r.returncode != 0 or not os.path.exists("o.npy"):
            problems.append("same tensors, other paths: exit %d: %s" % (r.returncode, r.stderr))
        for f in leftovers():
            os.remove(f)

        swap = lambda args, flag, path: [path if i > 0 and args[i - 1] == flag else a
                                         for i, a in enumerate(args)]
        cases = [
            ("K and V of 17 rows on rank 1",
             att, swap(swap(att, "--k", "k_17.npy"), "--v", "v_17.npy"), "--k differs"),
            ("Q of 17 rows on rank 1", att, swap(att, "--q", "q_17.npy"), "--q differs"),
            ("--causal on rank 1", att, att + ["--causal"], "--causal differs from rank 0's"),
            ("--window on rank 1", att, att + ["--window", "3,0"], "--window differs"),
            ("--grad-out on rank 1", att, att + ["--grad-out", "do.npy", "--grad-q", "dq.npy"],
             "--grad-out differs"),
            ("--lse on rank 0", att + ["--lse", "lse.npy"], att, "--lse differs"),
            ("X of 17 rows on rank 1", lay, swap(lay, "--x", "x_17.npy"), "--x differs"),
            ("layer --causal on rank 1", lay, lay + ["--causal"], "--causal differs"),
            ("layer --grad-out on rank 1", lay, lay + ["--grad-out", "dy.npy", "--grad-x",
                                                      "dx.npy"], "--grad-out differs"),
            ("layer --heads on rank 1", lay, swap(lay, "--heads", "4"), "--heads differs"),
        ]
        for what, rank0, rank1, expect in cases:
            result = refused(per_rank(launcher, qkv, rank0, rank1), what, expect)
            print("FAIL" if result else "ok", what)
            problems += result
    for p in problems:
        print("FAIL", p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
