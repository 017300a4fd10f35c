#!/usr/bin/env bash
# Installs qkv from the build tree into a scratch prefix, builds a separate project against it
# with find_package(qkv), and runs it: the library is usable as installed.
set -euo pipefail
build_dir=$1
source_dir=$(cd "$(dirname "$0")" && pwd)/consumer
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
cmake --install "$build_dir" --prefix "$scratch/prefix" >/dev/null
cmake -S "$source_dir" -B "$scratch/build" -DCMAKE_PREFIX_PATH="$scratch/prefix" \
  -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$scratch/build" >/dev/null
output=$(LD_LIBRARY_PATH="$scratch/prefix/lib:$scratch/prefix/lib64:${LD_LIBRARY_PATH:-}" \
  "$scratch/build/consumer")
echo "$output"
# softmax([1, 0]) = [e, 1] / (e + 1): out = w0·[1, 2] + w1·[3, 4].
expected="qkv $(sed -n 's/^project(qkv VERSION \([0-9.]*\).*/\1/p' "$(dirname "$0")/../../CMakeLists.txt"): 1.537883 2.537883"
[ "$output" = "$expected" ] || { echo "expected: $expected" >&2; exit 1; }
