#!/usr/bin/env python3
"""Medians over several runs of bench/run_grid.sh, as the Markdown tables of docs/performance.md.

    for i in 1 2 3; do bench/run_grid.sh build/qkv grid$i.jsonl; done
    bench/grid_median.py grid1.jsonl grid2.jsonl grid3.jsonl

The host is shared and noisy: one grid can catch a busy neighbour on any line, so each cell is
the median over the runs, and every run's own same-run ratio is listed beside it.
"""
import collections
import json
import statistics
import sys


def main(paths):
    cells = collections.defaultdict(list)
    for path in paths:
        with open(path) as f:
            for line in f:
                r = json.loads(line)
                cells[(r["n"], r["d"], r["causal"], r["threads"])].append(r)
    med = statistics.median
    print("| n | d | causal | threads | fused ms | baseline ms | fused GFLOP/s | % of peak "
          "| speedup | speedup per run |")
    print("|---|---|---|---|---:|---:|---:|---:|---:|---|")
    by_threads = collections.defaultdict(dict)
    for key in sorted(cells):
        runs = cells[key]
        speedups = [r["speedup_vs_baseline"] for r in runs]
        print("| %d | %d | %s | %d | %.2f | %.2f | %.1f | %.1f | %.2fx | %s |" % (
            key[0], key[1], "yes" if key[2] else "no", key[3],
            med(r["chosen"]["ms"] for r in runs), med(r["baseline"]["ms"] for r in runs),
            med(r["chosen"]["gflops"] for r in runs),
            100 * med(r["chosen"]["fraction_of_peak"] for r in runs), med(speedups),
            ", ".join("%.2f" % s for s in speedups)))
        by_threads[key[:3]][key[3]] = [r["chosen"]["ms"] for r in runs]
    print()
    print("| n | d | causal | 1 thread ms | 2 threads ms | 1 thread / 2 threads "
          "| per run |")
    print("|---|---|---|---:|---:|---:|---|")
    for key in sorted(by_threads):
        one, two = by_threads[key].get(1), by_threads[key].get(2)
        if not one or not two:
            continue
        print("| %d | %d | %s | %.2f | %.2f | %.2fx | %s |" % (
            key[0], key[1], "yes" if key[2] else "no", med(one), med(two),
            med(one) / med(two), ", ".join("%.2f" % (a / b) for a, b in zip(one, two))))


if __name__ == "__main__":
    main(sys.argv[1:])
