#!/usr/bin/env python3
"""Medians of bench/decode_grid.sh's rounds as a Markdown table.

Usage: bench/decode_median.py decode.jsonl
Each configuration's time is the median over rounds of each round's median call time; GB/s and
the fraction of the triad use that round's triad (measured in the same round); the baselines are
the median ratio (baseline time / cached time, same run).
"""
import json
import statistics
import sys
from collections import defaultdict


def main(path):
    rows = defaultdict(list)
    triads = []
    for line in open(path):
        line = line.strip()
        if not line:
            continue
        r = json.loads(line)
        if "round" in r:
            triads.append(r["triad"])
            continue
        lengths = r["lengths"]
        shape = (f"B={r['batch']} " + (f"nk={lengths[0]}" if len(set(lengths)) == 1
                                        else f"nk={min(lengths)}..{max(lengths)}") +
                 f" H={r['heads']}/Hkv={r['kv_heads']}")
        rows[(shape, r["dtype"])].append(r)
    print(f"triad (STREAM, 2 threads), per round: {', '.join(f'{t:.1f}' for t in triads)} GB/s\n")
    print("| shape | cache | ms (median) | GB/s | of triad | unfused_blas / cached | fused_hwy / cached |")
    print("|---|---|---|---|---|---|---|")
    for (shape, dtype), runs in rows.items():
        ms = statistics.median(r["cached"]["ms"] for r in runs)
        gbs = statistics.median(r["cached"]["gbs"] for r in runs)
        frac = statistics.median(r["cached"]["fraction_of_triad"] for r in runs)

        def ratio(name):
            vals = [r[name]["ratio_to_cached"] for r in runs if name in r and "ratio_to_cached" in r[name]]
            return f"{statistics.median(vals):.2f}x" if vals else "-"

        print(f"| {shape} | {dtype} | {ms:.2f} | {gbs:.1f} | {100 * frac:.0f} % | "
              f"{ratio('baseline_unfused_blas')} | {ratio('baseline_fused_hwy')} |")


if __name__ == "__main__":
    main(sys.argv[1])
