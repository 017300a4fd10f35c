#!/usr/bin/env bash
# Weak scaling of qkv attention --ring: n = N_PER_RANK rows per rank, so P ranks attend over
# P·N_PER_RANK rows and each rank does P times the work of one rank alone. Prints, for causal and
# non-causal, each P's slowest rank's ring time (the -v line's "total"), its wait as a share of
# its compute, and the efficiency P·T(1)/T(P) (1.0: perfect; the issue asks >= 0.9 at P = 2).
#
#   bench/ring_bench.sh [QKV] [RANKS...]     (defaults: build/qkv, 1 2)
#   N_PER_RANK=4096 HEADS=8 DIM=64 THREADS=1 MPIEXEC="mpirun --oversubscribe --allow-run-as-root"
set -euo pipefail
qkv=$(realpath "${1:-build/qkv}")
shift || true
[ $# -gt 0 ] && ranks=("$@") || ranks=(1 2)
n_per_rank=${N_PER_RANK:-4096}
heads=${HEADS:-8}
dim=${DIM:-64}
threads=${THREADS:-1}
mpiexec=${MPIEXEC:-mpirun --oversubscribe --allow-run-as-root -q}
python=${PYTHON:-/usr/bin/python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

printf '%-8s %3s %8s %12s %10s %10s\n' mask P n "time (s)" "wait/comp" efficiency
for mask in causal none; do
  flags=()
  [ "$mask" = causal ] && flags=(--causal)
  t1=""
  for p in "${ranks[@]}"; do
    n=$((n_per_rank * p))
    "$python" - "$work" "$n" "$heads" "$dim" <<'PY'
import sys, numpy as np
work, n, h, d = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rng = np.random.default_rng(0)
for name in "qkv":
    np.save(f"{work}/{name}.npy", rng.standard_normal((h, n, d), dtype=np.float32))
PY
    # shellcheck disable=SC2086
    lines=$($mpiexec -np "$p" "$qkv" attention --ring -v --quiet --threads "$threads" \
      --q "$work/q.npy" --k "$work/k.npy" --v "$work/v.npy" "${flags[@]}" \
      --out "$work/o.npy" 2>&1 >/dev/null | grep 'attention --ring: rank')
    read -r time share < <(awk '{
        for (i = 1; i <= NF; i++) {
          if ($i == "compute") c = $(i + 1); if ($i == "wait") w = $(i + 1);
          if ($i == "total") t = $(i + 1) }
        if (t > worst) worst = t; if (c > 0 && w / c > share) share = w / c }
      END { printf "%.6f %.4f\n", worst, share }' <<<"$lines")
    [ -z "$t1" ] && t1=$time
    eff=$(awk -v p="$p" -v t1="$t1" -v t="$time" 'BEGIN { printf "%.3f", p * t1 / t }')
    printf '%-8s %3d %8d %12s %10s %10s\n' "$mask" "$p" "$n" "$time" "$share" "$eff"
  done
done
