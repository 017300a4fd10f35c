#!/usr/bin/env bash
# Installs the Debian packages qkv builds and tests with. Idempotent: installs only what is missing.
set -euo pipefail

packages=(
  build-essential cmake pkg-config
  libopenblas-dev libcli11-dev libhwy-dev nlohmann-json3-dev libzip-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  python3-venv
  chromium
  clang libclang-rt-dev
  openmpi-bin libopenmpi-dev
)
# Python packages (numpy, torch, pytest, pybind11, playwright, mpi4py, transformers) come from PyPI,
# pinned in requirements.txt, into the project's venv .venv/ (scripts/install-python-deps.sh, run
# at the end); python3-venv lets a Debian python3 make one (and make wheel its fresh test venv).
# OpenMPI builds and runs ring attention across processes (src/dist, `mpirun -np P qkv attention
# --ring`); mpi4py (PyPI) gives qkv.ring_attention its communicator over it.
# clang and its runtime libraries (libFuzzer, the sanitizers) build the fuzz targets (make fuzz).
# The browser test (tests/browser) drives Debian's chromium with PyPI's playwright (no download).

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

bash "$(dirname "$0")/install-python-deps.sh"
