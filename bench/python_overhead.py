#!/usr/bin/python3
"""What a call from Python costs over the same call from C++ (issue 14's bar).

The bar: "a call from Python costs at most 20 us more than the same call from C++ at n = 16,
and at n >= 1024 it runs within 3 % of the C++ speed".

For each case, in one process on the same arrays: the median seconds of one
qkv.attention(q, k, v, threads=T) called from a Python loop (each call timed with
time.perf_counter_ns, garbage collection off as in timeit), against the median of the same
call in _qkv.time_attention's C++ loop (steady_clock per call, GIL released, the same views of
the same arrays, the output allocated and freed in each call). The two loops alternate in
several rounds and each side's samples are pooled, so that a slow spell on a shared machine
falls on both. Cases: n = 16 (d = 64, H = 1 and H = 4), n = 1024 and 2048 (d = 64, H = 8),
each with threads=1 and threads=None (one per hardware thread), and n = 16 with torch tensors
in when torch imports (qkv._arrays reads a CPU tensor through tensor.detach().numpy(), in
place; the C++ loop reads that same NumPy view).

Prints a table (us per call, difference, ratio) and one JSON line; with --check, exits 1 when
a bar is missed (n = 16: difference > 20 us; n >= 1024: ratio > 1.03).

    PYTHONPATH=build/python /usr/bin/python3 bench/python_overhead.py [--check] [--quick]
"""

import argparse
import gc
import json
import os
import statistics
import sys
import time

import numpy as np

import qkv
from qkv import _qkv
from qkv._options import attention_options

SMALL_BAR_US = 20.0  # n = 16: Python may add at most this much per call
LARGE_BAR_RATIO = 1.03  # n >= 1024: Python within 3 % of C++


def python_times(q, k, v, threads, count):
    attention = qkv.attention
    clock = time.perf_counter_ns
    times = []
    out = None
    for _ in range(count):
        start = clock()
        out = attention(q, k, v, threads=threads)
        stop = clock()
        times.append((stop - start) * 1e-9)
    del out
    return times


def measure(q, k, v, threads, rounds, per_round):
    """Pooled per-call seconds of (Python, C++), alternating rounds."""
    py_all, cpp_all = [], []
    kernel = None
    # Warm up both paths (threads, caches, the allocator).
    python_times(q, k, v, threads, 2)
    options = attention_options(threads=threads)
    _qkv.time_attention(as_numpy(q), as_numpy(k), as_numpy(v), options, repeats=1)
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(rounds):
            # The C++ loop reads exactly the arrays qkv.attention reads (torch through DLPack).
            times, kernel = _qkv.time_attention(as_numpy(q), as_numpy(k), as_numpy(v), options,
                                                repeats=per_round, warmup=0)
            cpp_all += times
            py_all += python_times(q, k, v, threads, per_round)
    finally:
        if gc_was_enabled:
            gc.enable()
    return py_all, cpp_all, kernel


def as_numpy(x):
    from qkv._arrays import as_input
    return as_input(x)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a bar is missed")
    parser.add_argument("--quick", action="store_true", help="fewer repeats (a smoke run)")
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    scale = 0.2 if args.quick else 1.0
    # (label, n, d, heads, input kind, rounds, calls per round)
    cases = [
        ("n=16 H=1", 16, 64, 1, "numpy", 10, 2000),
        ("n=16 H=4", 16, 64, 4, "numpy", 10, 2000),
        ("n=16 H=4 torch", 16, 64, 4, "torch", 10, 2000),
        # One call per round: the two sides alternate call by call, so that the machine's slow
        # spells (it is shared) fall on both alike.
        ("n=1024 H=8", 1024, 64, 8, "numpy", 48, 1),
        ("n=2048 H=8", 2048, 64, 8, "numpy", 16, 1),
    ]
    try:
        import torch
    except ImportError:
        torch = None

    rows = []
    for label, n, d, heads, kind, rounds, per_round in cases:
        if kind == "torch" and torch is None:
            print(f"{label}: skipped (torch does not import)")
            continue
        arrays = [rng.standard_normal((heads, n, d)).astype(np.float32) for _ in range(3)]
        if kind == "torch":
            arrays = [torch.from_numpy(a) for a in arrays]
        for threads in (1, None):
            r = max(2, int(rounds * scale)) if n >= 1024 else rounds
            p = max(1, int(per_round * scale))
            py, cpp, kernel = measure(*arrays, threads, r, p)
            py_us = statistics.median(py) * 1e6
            cpp_us = statistics.median(cpp) * 1e6
            row = {
                "case": label, "n": n, "d": d, "heads": heads, "input": kind,
                "threads": threads if threads is not None else os.cpu_count(),
                "threads_arg": threads, "kernel": kernel, "calls": len(py),
                "python_us": py_us, "cpp_us": cpp_us, "diff_us": py_us - cpp_us,
                "ratio": py_us / cpp_us,
            }
            if n <= 16:
                row["bar"] = f"diff <= {SMALL_BAR_US:g} us"
                row["pass"] = row["diff_us"] <= SMALL_BAR_US
            elif n >= 1024:
                row["bar"] = f"ratio <= {LARGE_BAR_RATIO:g}"
                row["pass"] = row["ratio"] <= LARGE_BAR_RATIO
            rows.append(row)

    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    print(f"qkv {qkv.__version__}; CPU {cpu}; {len(os.sched_getaffinity(0))} CPUs usable; "
          f"medians of per-call times")
    header = (f"{'case':<16} {'threads':>7} {'kernel':<10} {'calls':>6} {'python us':>11} "
              f"{'C++ us':>11} {'diff us':>9} {'ratio':>7}  bar")
    print(header)
    print("-" * len(header))
    for row in rows:
        threads = "1" if row["threads_arg"] == 1 else f"None={row['threads']}"
        verdict = "ok" if row["pass"] else "MISSED"
        print(f"{row['case']:<16} {threads:>7} {row['kernel']:<10} {row['calls']:>6} "
              f"{row['python_us']:>11.2f} {row['cpp_us']:>11.2f} {row['diff_us']:>9.2f} "
              f"{row['ratio']:>7.4f}  {row['bar']}: {verdict}")
    missed = [row for row in rows if not row["pass"]]
    print(json.dumps({"benchmark": "python_overhead", "cpu": cpu, "rows": rows,
                      "all_bars_met": not missed}))
    if args.check and missed:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
