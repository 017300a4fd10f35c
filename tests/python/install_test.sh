#!/usr/bin/env bash
# make install-python's script installs a package that stands alone: copied into a scratch
# site-packages, it imports from another folder with no build tree on any path (the extension
# carries the library: no libqkv.so to find) and computes; a second install replaces the first.
set -euo pipefail
build_dir=$1
python=${2:-/usr/bin/python3}
source_dir=$(cd "$(dirname "$0")/../.." && pwd)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
install() { PYTHON="$python" bash "$source_dir/scripts/install-python.sh" "$build_dir" "$1"; }
install "$scratch/site" >/dev/null
install "$scratch/site" >/dev/null  # over the first
cd "$scratch"
env -u PYTHONPATH -u LD_LIBRARY_PATH PYTHONNOUSERSITE=1 "$python" - "$scratch/site" <<'PY'
import sys
site = sys.argv[1]
sys.path.insert(0, site)
import numpy as np
import qkv
assert qkv.__file__.startswith(site), qkv.__file__
out = qkv.attention(np.array([[1.0, 0.0]]), np.eye(2), np.array([[1.0, 2.0], [3.0, 4.0]]),
                    scale=1.0)
w0 = np.e / (np.e + 1)
assert abs(out[0, 0] - (w0 * 1 + (1 - w0) * 3)) < 1e-14, out
leftovers = [name for name in __import__("os").listdir(site) if name != "qkv"]
assert not leftovers, leftovers
print("qkv", qkv.__version__, "imports and computes from", site)
PY
