#!/usr/bin/env bash
# The explain benchmark (issues 4 and 12): `qkv explain --html` of the layer form at n = 8192,
# H = 4, d = 64 (no mask, causal) and a causal batch of 8 elements of n / 4 rows: peak memory
# by /usr/bin/time -v (the budget is 1 GiB), then each page's size and timings in headless
# Chromium (page_timing.py; the budget is 12 MB and interactive within 1.5 s). A benchmark, not
# a ctest test; it exits non-zero when a page is over budget or logs an error.
#   tests/browser/bench_explain.sh [build/qkv] [n]
# Python is the project's venv (NumPy and playwright), or $PYTHON.
set -euo pipefail
qkv=$(realpath "${1:-build/qkv}")
n=${2:-8192}
here=$(cd "$(dirname "$0")" && pwd)
# Absolute (the script works in a temporary folder), but not resolved: a venv's python is a
# symlink, and the venv is found from the path it was called by.
python=${PYTHON:-$(cd "$here/../.." && pwd)/.venv/bin/python}
[[ $python == */* ]] && python=$(realpath -s "$python")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
"$python" - "$n" <<'PY'
import sys
import numpy as np
n, heads, d = int(sys.argv[1]), 4, 64
rng = np.random.default_rng(0)
np.save("x.npy", rng.standard_normal((n, heads * d)).astype(np.float32))
# Eight batch elements of n / 4 rows: the page holds them all within the same budget.
np.save("xb.npy", rng.standard_normal((8, n // 4, heads * d)).astype(np.float32))
for name in ("wq", "wk", "wv"):
    w = rng.standard_normal((heads * d, heads * d)) / np.sqrt(heads * d)
    np.save(name + ".npy", w.astype(np.float32))
PY
status=0
for run in "x.npy" "x.npy --causal" "xb.npy --causal"; do
  set -- $run
  x=$1
  shift
  /usr/bin/time -v "$qkv" explain --quiet --x "$x" --wq wq.npy --wk wk.npy --wv wv.npy \
    --heads 4 "$@" --html page.html >/dev/null 2>time.txt
  echo "qkv explain --html, $x ($("$python" -c "import numpy as np; print(list(np.load('$x', mmap_mode='r').shape))")) H=4 d=64 ${*:-(no mask)}:" \
    "$(grep -E 'Maximum resident' time.txt | awk '{print $NF}') KiB peak," \
    "$(grep -E 'Elapsed' time.txt | awk '{print $NF}') wall, page $(stat -c %s page.html) bytes"
  "$python" "$here/page_timing.py" "$work/page.html" || status=$?
done
exit "$status"
