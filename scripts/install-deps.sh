#!/usr/bin/env bash
# Installs the Debian packages qkv builds and tests with. Idempotent: installs only what is missing.
set -euo pipefail

packages=(
  build-essential cmake pkg-config
  libopenblas-dev libcli11-dev libhwy-dev nlohmann-json3-dev libzip-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  python3-numpy python3-dev pybind11-dev python3-pytest python3-torch
  chromium nodejs
  clang libclang-rt-14-dev
  openmpi-bin libopenmpi-dev python3-mpi4py
)
# The Python module builds with pybind11 for Debian's python3; its tests (tests/python) use pytest
# and compare with PyTorch (python3-torch).
# OpenMPI builds and runs ring attention across processes (src/dist, `mpirun -np P qkv attention
# --ring`); python3-mpi4py gives qkv.ring_attention its communicator.
# clang and its runtime libraries (libFuzzer, the sanitizers) build the fuzz targets (make fuzz).
# The browser test (tests/browser) drives Debian's chromium with playwright-core from npm. Some
# machines have Node.js from elsewhere with its own npm, which Debian's npm package would clash
# with: ask for npm only where there is none.
command -v npm >/dev/null 2>&1 || packages+=(npm)

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

# playwright-core for the browser test, exactly as package-lock.json pins it; only when the
# installed version differs (npm ci starts from an empty node_modules each time).
browser="$(cd "$(dirname "$0")/../tests/browser" && pwd)"
wanted=$(node -p "require('$browser/package.json').dependencies['playwright-core']")
have=$(node -p "try { require('$browser/node_modules/playwright-core/package.json').version } catch { '' }")
if [ "$have" != "$wanted" ]; then
  (cd "$browser" && npm ci --no-audit --no-fund --loglevel=error)
fi
