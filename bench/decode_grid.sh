#!/usr/bin/env bash
# The decode grid of docs/performance.md: three rounds of the STREAM triad and qkv bench --decode
# at nk = 32768 and 131072, H = Hkv = 8 and H = 32 / Hkv = 8, d = 128, every cache type, 2
# threads, and a batch of 16 mixed lengths 1k..32k; one JSON object per line to OUT
# (bench/decode_median.py makes the table). The baselines use OpenBLAS, so the OpenBLAS variables
# are unset for these runs only (bench/openblas_run.sh says why, and handles the Prescott
# fallback).
#
#   bench/decode_grid.sh [path/to/qkv] [decode.jsonl]
set -euo pipefail
QKV=${1:-build/qkv}
OUT=${2:-decode.jsonl}
# shellcheck source=bench/openblas_run.sh
source "$(dirname "$0")/openblas_run.sh"
: > "$OUT"
for round in 1 2 3; do
  triad=$("${RUN[@]}" bench --peak --threads 2 --json | sed -E 's/.*"triad_gbs": ([0-9.]+).*/\1/')
  echo "{\"round\": $round, \"triad\": $triad}" >> "$OUT"
  echo "round $round: triad $triad GB/s" >&2
  for nk in 32768 131072; do
    for heads in "8 8" "32 8"; do
      read -r h hkv <<< "$heads"
      for dtype in f32 bf16 f16 int8; do
        "${RUN[@]}" bench --decode --nk "$nk" --heads "$h" --kv-heads "$hkv" --d 128 \
          --dtype "$dtype" --threads 2 --bandwidth-gbs "$triad" --json | tr -d '\n' >> "$OUT"
        echo >> "$OUT"
      done
    done
  done
  for dtype in f32 int8; do
    "${RUN[@]}" bench --decode --batch 16 --mixed-lengths 1024,32768 --heads 8 --d 128 \
      --dtype "$dtype" --threads 2 --bandwidth-gbs "$triad" --json | tr -d '\n' >> "$OUT"
    echo >> "$OUT"
  done
done
