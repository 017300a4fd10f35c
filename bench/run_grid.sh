#!/usr/bin/env bash
# The benchmark grid of docs/performance.md: qkv bench for n in {512 .. 8192}, d in {64, 128},
# causal and not, 1 and 2 threads, B = 1, H = 8, fp32; each line the chosen kernel against the
# unfused CBLAS baseline in the same run. Then the backward on the same grid (qkv bench
# --backward: the chosen backward kernel against the unfused CBLAS backward and the forward),
# its lines to a file of their own, OUT with -backward before .jsonl; QKV_GRID_FORWARD_ONLY=1
# keeps the forward grid alone.
#
#   bench/run_grid.sh [path/to/qkv] [out.jsonl]
#
# OpenBLAS picks slow AVX2 kernels while OPENBLAS_CORETYPE or OPENBLAS_L2_SIZE is set in the
# environment, which would flatter the fused kernel: this script unsets both for its runs (and
# only here; tests and CI leave them alone). The fp32 FMA peak is measured once per thread
# count (qkv bench --peak) and passed to every run.
set -euo pipefail
QKV=${1:-build/qkv}
OUT=${2:-bench-grid.jsonl}
BACKWARD_OUT="${OUT%.jsonl}-backward.jsonl"
# shellcheck source=bench/openblas_run.sh
source "$(dirname "$0")/openblas_run.sh"
: > "$OUT"
declare -A PEAK
for t in 1 2; do
  PEAK[$t]=$("${RUN[@]}" bench --peak --threads "$t" --json | sed -E 's/.*"peak_gflops": ([0-9.]+).*/\1/')
  echo "fp32 FMA peak, $t thread(s): ${PEAK[$t]} GFLOP/s" >&2
done
printf '%-6s %-4s %-7s %-3s %10s %10s %9s %8s %7s\n' n d causal T fused_ms blas_ms GFLOP/s %peak speedup
for n in 512 1024 2048 4096 8192; do
  for d in 64 128; do
    for causal in "" "--causal"; do
      for t in 1 2; do
        line=$("${RUN[@]}" bench --n "$n" --d "$d" --heads 8 --threads "$t" $causal \
                 --peak-gflops "${PEAK[$t]}" --json | tr -d '\n')
        echo "$line" >> "$OUT"
        python3 - "$line" <<'PY'
import json, sys
r = json.loads(sys.argv[1])
c, b = r["chosen"], r.get("baseline")
print("%-6d %-4d %-7s %-3d %10.2f %10s %9.1f %7.1f%% %7s" % (
    r["n"], r["d"], "yes" if r["causal"] else "no", r["threads"], c["ms"],
    "%.2f" % b["ms"] if b else "-", c["gflops"], 100 * c["fraction_of_peak"],
    "%.2fx" % r["speedup_vs_baseline"] if b else "-"))
PY
      done
    done
  done
done
if [ "${QKV_GRID_FORWARD_ONLY:-0}" = 1 ]; then exit 0; fi

: > "$BACKWARD_OUT"
echo >&2
echo "backward (GFLOP/s: 2.5x the forward's useful flops) -> $BACKWARD_OUT" >&2
printf '%-6s %-4s %-7s %-3s %-13s %10s %10s %10s %9s %8s %7s\n' n d causal T kernel bwd_ms blas_ms \
  fwd_ms GFLOP/s %peak speedup
for n in 512 1024 2048 4096 8192; do
  for d in 64 128; do
    for causal in "" "--causal"; do
      for t in 1 2; do
        line=$("${RUN[@]}" bench --backward --n "$n" --d "$d" --heads 8 --threads "$t" $causal \
                 --peak-gflops "${PEAK[$t]}" --json | tr -d '\n')
        echo "$line" >> "$BACKWARD_OUT"
        python3 - "$line" <<'PY'
import json, sys
r = json.loads(sys.argv[1])
c, b = r["chosen"], r.get("baseline")
print("%-6d %-4d %-7s %-3d %-13s %10.2f %10s %10.2f %9.1f %7.1f%% %7s" % (
    r["n"], r["d"], "yes" if r["causal"] else "no", r["threads"], c["kernel"], c["ms"],
    "%.2f" % b["ms"] if b else "-", r["forward_ms"], c["gflops"], 100 * c["fraction_of_peak"],
    "%.2fx" % r["speedup_vs_baseline"] if b else "-"))
PY
      done
    done
  done
done
