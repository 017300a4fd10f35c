#!/usr/bin/env bash
# A built qkv wheel stands alone (make wheel runs this on the repaired manylinux wheel):
#   tests/python/wheel_smoke_test.sh WHEEL [PYTHON]
# A fresh venv (no system site-packages) made by PYTHON (default .venv/bin/python, whose base
# interpreter it uses) installs WHEEL and requirements.txt's NumPy; then, from a folder outside
# the source tree with no PYTHONPATH, qkv imports from that venv and computes (attention against
# NumPy's formula, a product through the bundled BLAS, an .npz read through the bundled libzip),
# reports CMakeLists.txt's version, ships its stubs and py.typed, and loads no library from
# outside the wheel but the manylinux policy's own (libc, libstdc++, ...).
set -euo pipefail
wheel=$(realpath "$1")
source_dir=$(cd "$(dirname "$0")/../.." && pwd)
python=${2:-$source_dir/.venv/bin/python}
numpy_pin=$(grep -E '^numpy==' "$source_dir/requirements.txt")
version=$(sed -nE 's/^project\(qkv[[:space:]]+VERSION[[:space:]]+([0-9.]+).*/\1/p' \
  "$source_dir/CMakeLists.txt")

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
env -u PYTHONPATH "$python" -m venv "$scratch/venv"
env -u PYTHONPATH "$scratch/venv/bin/python" -m pip install -q --disable-pip-version-check \
  "$wheel" "$numpy_pin"

cd "$scratch"
env -u PYTHONPATH -u LD_LIBRARY_PATH PYTHONNOUSERSITE=1 "$scratch/venv/bin/python" - \
  "$scratch/venv" "$version" <<'PY'
import importlib.metadata
import pathlib
import subprocess
import sys

import numpy as np

import qkv
from qkv import _qkv

venv, version = pathlib.Path(sys.argv[1]), sys.argv[2]
package = pathlib.Path(qkv.__file__).parent
assert package.is_relative_to(venv), f"qkv imported from {package}, not from {venv}"

assert qkv.__version__ == version, (qkv.__version__, version)
assert importlib.metadata.version("qkv") == version, importlib.metadata.version("qkv")
# The metadata pip and PyPI show: the summary and the licence, whose text the wheel carries.
metadata = importlib.metadata.metadata("qkv")
assert metadata["Summary"] and metadata["License-Expression"] == "MIT", dict(metadata)
assert any(str(f).endswith("LICENSE") for f in importlib.metadata.files("qkv")), "no LICENSE"

# Causal attention on float64 inputs against softmax(q·kᵀ/sqrt(d) + mask)·v in NumPy: the
# kernels accumulate in float64 here, so they agree to a few ulps of values of order 1.
rng = np.random.default_rng(7)
q, k, v = (rng.standard_normal((2, 3, n, 16)) for n in (5, 7, 7))
scores = q @ k.swapaxes(-1, -2) / np.sqrt(16)
scores[..., np.arange(7)[None, :] > np.arange(5)[:, None] + 2] = -np.inf  # bottom-right causal
weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
expected = (weights / weights.sum(axis=-1, keepdims=True)) @ v
out = qkv.attention(q, k, v, is_causal=True)
assert out.dtype == np.float64 and out.shape == (2, 3, 5, 16), (out.dtype, out.shape)
assert np.max(np.abs(out - expected)) < 1e-13, np.max(np.abs(out - expected))

# qkv.linear is a BLAS product (the OpenBLAS the wheel carries): float64 within 1e-12 of NumPy's.
x, w = rng.standard_normal((9, 33)), rng.standard_normal((33, 10))
assert np.max(np.abs(qkv.linear(x, w) - x @ w)) < 1e-12

# An .npz member goes through libzip (carried by the wheel too); np.savez stores it exactly.
np.savez("inputs.npz", q=q[0, 0])
assert np.array_equal(qkv.read_tensor("inputs.npz:q"), q[0, 0])

# The wheel is built without MPI (pyproject.toml): ring attention says so instead of loading one.
assert not qkv.mpi_available()

# The type information editors and type checkers read.
for name in ["py.typed", "_qkv.pyi", "_attention.pyi", "_layer.pyi", "_kv_cache.pyi",
             "_explain.pyi", "_io.pyi", "_bench.pyi", "_ring.pyi", "_types.pyi"]:
    assert (package / name).is_file(), f"{name} is not in the installed package"

# The wheel holds the package and the libraries auditwheel put beside it; nothing of the C++
# installation (headers, libqkv.so, the CMake package, the CLI).
files = [str(f) for f in importlib.metadata.files("qkv")]
strays = [f for f in files if not f.startswith(("qkv/", "qkv.libs/", "qkv-"))]
assert not strays, strays

# Every library the extension loads is the system's own under the manylinux policy (auditwheel's
# list for manylinux_2_34, which the older policies' lists equal), the kernel's vDSO and the
# loader, or one in the wheel's qkv.libs.
policy = {"libatomic.so.1", "libgcc_s.so.1", "libstdc++.so.6", "libm.so.6", "libmvec.so.1",
          "libanl.so.1", "libdl.so.2", "librt.so.1", "libc.so.6", "libnsl.so.1", "libutil.so.1",
          "libpthread.so.0", "libX11.so.6", "libXext.so.6", "libXrender.so.1", "libICE.so.6",
          "libSM.so.6", "libGL.so.1", "libgobject-2.0.so.0", "libgthread-2.0.so.0",
          "libglib-2.0.so.0", "libresolv.so.2", "libexpat.so.1", "libz.so.1",
          "linux-vdso.so.1", "ld-linux-x86-64.so.2"}
ldd = subprocess.run(["ldd", _qkv.__file__], check=True, capture_output=True, text=True).stdout
bundled = []
for line in ldd.splitlines():
    name, _, where = line.strip().partition(" => ")
    if pathlib.PurePath(name.split(" ")[0]).name in policy:
        continue
    assert where.startswith(str(venv)) and "/qkv.libs/" in where, f"from outside the wheel: {line}"
    bundled.append(name)
assert any(name.startswith("libopenblas") for name in bundled), bundled

print(f"qkv {qkv.__version__} from the wheel: imports and computes in a fresh venv ({package})")
PY
