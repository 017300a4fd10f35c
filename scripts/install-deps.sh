#!/usr/bin/env bash
# Installs the Debian packages qkv builds and tests with. Idempotent: installs only what is missing.
#   scripts/install-deps.sh demo   what the qkv executable needs: the compiler, CMake and the
#                                  libraries it links (what `make demo` runs)
#   scripts/install-deps.sh [all]  everything the tests, the Python module, the fuzz targets and
#                                  the browser test need, then the venv (what `make test` runs)
set -euo pipefail

what=${1:-all}
demo_packages=(
  build-essential cmake pkg-config
  libopenblas-dev libcli11-dev libhwy-dev nlohmann-json3-dev libzip-dev
)
all_packages=(
  "${demo_packages[@]}"
  libgtest-dev libgmock-dev libbenchmark-dev
  python3-venv
  chromium
  clang libclang-rt-dev
  openmpi-bin libopenmpi-dev
)
# Python packages (numpy, torch, pytest, pybind11, playwright, mpi4py, transformers) come from PyPI,
# pinned in requirements.txt, into the project's venv .venv/ (scripts/install-python-deps.sh, run
# at the end of `all`); python3-venv lets a Debian python3 make one (and make wheel its fresh test
# venv). OpenMPI builds and runs ring attention across processes (src/dist, `mpirun -np P qkv
# attention --ring`); mpi4py (PyPI) gives qkv.ring_attention its communicator over it.
# clang and its runtime libraries (libFuzzer, the sanitizers) build the fuzz targets (make fuzz).
# The browser test (tests/browser) drives Debian's chromium with PyPI's playwright (no download).
case "$what" in
  demo) packages=("${demo_packages[@]}") ;;
  all) packages=("${all_packages[@]}") ;;
  *)
    echo "install-deps: unknown set '$what' (demo or all)" >&2
    exit 2
    ;;
esac

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "install-deps: missing packages: ${missing[*]} (run as root, or install them)" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

if [ "$what" = all ]; then
  bash "$(dirname "$0")/install-python-deps.sh"
fi
