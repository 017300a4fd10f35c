#!/usr/bin/env python3
"""Medians of bench/bf16_grid.sh's rounds as a Markdown table.

Usage: bench/bf16_median.py bf16.jsonl
Per configuration: the median over rounds of the bf16 call's median time, its GFLOP/s and
fraction of the bf16 dot-product peak (measured in the same run), and the median over rounds of
the same-run ratio (float32 fused time / bf16 time), with its range.
"""
import json
import statistics
import sys
from collections import defaultdict


def main(path):
    rows = defaultdict(list)
    for line in open(path):
        line = line.strip()
        if not line:
            continue
        r = json.loads(line)
        if "n" not in r:
            print(f"peaks: fp32 FMA {r['peak_gflops']:.0f} GFLOP/s, bf16 dot "
                  f"{r['bf16_dot_peak_gflops']:.0f} GFLOP/s on {r['threads']} threads\n")
            continue
        key = (r["n"], r["d"], "causal" if r["causal"] else "non-causal")
        rows[key].append(r)
    print("| n | d | mask | bf16 ms | bf16 GFLOP/s | of bf16 dot peak | f32 fused ms "
          "| f32 / bf16 (median, range) | path |")
    print("|---|---|---|---|---|---|---|---|---|")
    for key in sorted(rows):
        runs = rows[key]
        ms = statistics.median(r["chosen"]["ms"] for r in runs)
        gf = statistics.median(r["chosen"]["gflops"] for r in runs)
        frac = statistics.median(r["chosen"]["fraction_of_peak"] for r in runs)
        f32 = statistics.median(r["f32_fused"]["ms"] for r in runs)
        ratios = [r["speedup_vs_f32_fused"] for r in runs]
        print(f"| {key[0]} | {key[1]} | {key[2]} | {ms:.2f} | {gf:.0f} | {100 * frac:.0f} % "
              f"| {f32:.2f} | {statistics.median(ratios):.2f}x ({min(ratios):.2f}-"
              f"{max(ratios):.2f}) | {runs[0]['path']} |")


if __name__ == "__main__":
    main(sys.argv[1])
