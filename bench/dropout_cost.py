#!/usr/bin/python3
"""What attention dropout costs: the time of a call with dropout over the same call without.

The bar: the forward and the backward with dropout at most 1.15x their time without.

On a shared machine the time of one call moves by up to 2x from one second to the next, and
two benchmarks run seconds apart (Google Benchmark's repetitions, `qkv bench` processes) see
different machines. So the two calls run in adjacent pairs, ~40 ms apart at n = 2048, the order
alternating from pair to pair, and the figure is the median of the pairs' ratios: a slow spell
falls on both calls of a pair. Also printed: the ratio of the 20th percentiles and of the
fastest calls. Inputs are standard normal float32 [H, n, d] (numpy's default_rng(0)); dropout
p = 0.1, seed 3 (the same as `qkv bench --dropout 0.1 --seed 3` and qkv_bench_backward's
forward_dropout / bwd_dropout_fused_hwy); the backward takes the forward's own output and lse.
Unset OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE for it (they do not touch the fused kernels, but
keep the host's state the same as for the other benchmarks).

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE PYTHONPATH=build/python \\
        .venv/bin/python bench/dropout_cost.py [--pairs 50] [--threads 2] [--only fwd,bwd]

Prints one line per case and one JSON line; with --check, exits 1 when a median ratio is
above 1.15.
"""

import argparse
import gc
import json
import statistics
import sys
import time

import numpy as np

import qkv

BAR = 1.15
DROPOUT = {"dropout_p": 0.1, "seed": 3}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=2048)
    parser.add_argument("--d", type=int, default=64)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--pairs", type=int, default=50, help="pairs per case (forward)")
    parser.add_argument("--only", default="fwd,bwd", help="fwd, bwd or both (comma-separated)")
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--check", action="store_true", help=f"exit 1 above {BAR}x")
    args = parser.parse_args()
    kinds = [k for k in args.only.split(",") if k]
    if not kinds or any(k not in ("fwd", "bwd") for k in kinds):
        print(f"dropout_cost.py: --only: expected fwd, bwd or fwd,bwd, got {args.only!r}",
              file=sys.stderr)
        return 2
    if min(args.n, args.d, args.heads, args.threads, args.pairs) < 1:
        print("dropout_cost.py: --n, --d, --heads, --threads and --pairs must be >= 1",
              file=sys.stderr)
        return 2

    rng = np.random.default_rng(0)
    shape = (args.heads, args.n, args.d)
    q, k, v, dout = (rng.standard_normal(shape).astype(np.float32) for _ in range(4))
    common = {"threads": args.threads, "is_causal": args.causal}
    plain = qkv.attention(q, k, v, return_lse=True, **common)
    dropped = qkv.attention(q, k, v, return_lse=True, **common, **DROPOUT)

    def call(kind, with_dropout):
        extra = DROPOUT if with_dropout else {}
        if kind == "fwd":
            qkv.attention(q, k, v, **common, **extra)
        else:
            out, lse = (dropped if with_dropout else plain)[:2]
            qkv.attention_backward(q, k, v, out, lse, dout, **common, **extra)

    results = []
    gc.disable()
    for kind in kinds:
        # The backward takes ~3x the forward: fewer pairs for about the same wall time.
        pairs = args.pairs if kind == "fwd" else max(args.pairs // 2, 1)
        for with_dropout in (False, True, False, True):
            call(kind, with_dropout)
        without, with_ = [], []
        for i in range(pairs):
            times = {}
            for with_dropout in ((False, True) if i % 2 == 0 else (True, False)):
                start = time.perf_counter()
                call(kind, with_dropout)
                times[with_dropout] = time.perf_counter() - start
            without.append(times[False])
            with_.append(times[True])
        ratios = [b / a for a, b in zip(without, with_)]
        p20 = lambda xs: sorted(xs)[len(xs) // 5]
        row = {
            "kind": kind, "n": args.n, "d": args.d, "heads": args.heads,
            "threads": args.threads, "causal": args.causal, "pairs": pairs,
            "without_ms_median": statistics.median(without) * 1e3,
            "with_ms_median": statistics.median(with_) * 1e3,
            "pair_ratio_median": statistics.median(ratios),
            "p20_ratio": p20(with_) / p20(without),
            "min_ratio": min(with_) / min(without),
        }
        results.append(row)
        print(f"{kind}: n={args.n} d={args.d} H={args.heads} threads={args.threads}"
              f"{' causal' if args.causal else ''}, {pairs} pairs: without "
              f"{row['without_ms_median']:.1f} ms, with {row['with_ms_median']:.1f} ms (medians);"
              f" ratio {row['pair_ratio_median']:.3f} (median of pairs),"
              f" {row['p20_ratio']:.3f} (20th percentiles), {row['min_ratio']:.3f} (fastest)")
    gc.enable()
    print(json.dumps({"dropout_cost": results}))
    if args.check and any(r["pair_ratio_median"] > BAR for r in results):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
