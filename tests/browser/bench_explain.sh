#!/usr/bin/env bash
# The explain benchmark (issues 4 and 12): `qkv explain --html` of the layer form at n = 8192,
# H = 4, d = 64 (peak memory by /usr/bin/time -v; the budget is 1 GiB), then each page's size
# and timings in headless Chromium (page_timing.mjs; the budget is 12 MB and interactive within
# 1.5 s). A benchmark, not a ctest test.
#   tests/browser/bench_explain.sh [build/qkv] [n]
set -euo pipefail
qkv=$(realpath "${1:-build/qkv}")
n=${2:-8192}
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
/usr/bin/python3 - "$n" <<'PY'
import sys
import numpy as np
n, heads, d = int(sys.argv[1]), 4, 64
rng = np.random.default_rng(0)
np.save("x.npy", rng.standard_normal((n, heads * d)).astype(np.float32))
for name in ("wq", "wk", "wv"):
    w = rng.standard_normal((heads * d, heads * d)) / np.sqrt(heads * d)
    np.save(name + ".npy", w.astype(np.float32))
PY
status=0
for masking in "" "--causal"; do
  /usr/bin/time -v "$qkv" explain --quiet --x x.npy --wq wq.npy --wk wk.npy --wv wv.npy \
    --heads 4 $masking --html page.html >/dev/null 2>time.txt
  echo "qkv explain --html, n=$n H=4 d=64 ${masking:-(no mask)}:" \
    "$(grep -E 'Maximum resident' time.txt | awk '{print $NF}') KiB peak," \
    "$(grep -E 'Elapsed' time.txt | awk '{print $NF}') wall, page $(stat -c %s page.html) bytes"
  node "$here/page_timing.mjs" "$work/page.html" || status=$?
done
exit "$status"
