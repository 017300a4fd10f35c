#!/usr/bin/env bash
# The bf16 grid of docs/performance.md ("bf16 on AVX512-BF16"): ROUNDS rounds (default 3) of
# `qkv bench --dtype bf16` at n = 2048 and 4096, d = 64 and 128, non-causal and causal, B = 1,
# H = 8, THREADS threads (default 2); each run times the bf16 call (Q, K, V stored as bf16) and
# then the float32 fused kernel on float32 copies of the same values, so the ratio is a same-run
# ratio. One JSON object per line to OUT (bench/bf16_median.py makes the table). The unfused baseline uses
# OpenBLAS, so the OpenBLAS variables are unset for these runs only (bench/openblas_run.sh).
#
#   bench/bf16_grid.sh [path/to/qkv] [bf16.jsonl]
set -euo pipefail
QKV=${1:-build/qkv}
OUT=${2:-bf16.jsonl}
ROUNDS=${ROUNDS:-3}
THREADS=${THREADS:-2}
# shellcheck source=bench/openblas_run.sh
source "$(dirname "$0")/openblas_run.sh"
: > "$OUT"
peaks=$("${RUN[@]}" bench --peak --threads "$THREADS" --json)
echo "$peaks" >> "$OUT"
echo "peaks: $peaks" >&2
fma=$(echo "$peaks" | sed -E 's/.*"peak_gflops": ([0-9.]+).*/\1/')
for round in $(seq "$ROUNDS"); do
  for n in 2048 4096; do
    for d in 64 128; do
      for causal in "" "--causal"; do
        # shellcheck disable=SC2086
        "${RUN[@]}" bench --n "$n" --d "$d" --heads 8 $causal --dtype bf16 --threads "$THREADS" \
          --repeats 5 --peak-gflops "$fma" --json | tr -d '\n' >> "$OUT"
        echo >> "$OUT"
        echo "round $round n=$n d=$d ${causal:-non-causal}: done" >&2
      done
    done
  done
done
