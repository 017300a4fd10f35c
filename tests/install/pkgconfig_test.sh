#!/usr/bin/env bash
# Installs qkv from the build tree into a scratch prefix and builds a C program against it with
# nothing but gcc and pkg-config: the C API and qkv.pc are usable as installed.
set -euo pipefail
build_dir=$1
here=$(cd "$(dirname "$0")" && pwd)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
cmake --install "$build_dir" --prefix "$scratch/prefix" >/dev/null
# GNUInstallDirs may choose lib, lib64 or lib/<multiarch>.
pc_file=$(find "$scratch/prefix" -name qkv.pc -path '*/pkgconfig/*' | head -n 1)
[ -n "$pc_file" ] || { echo "no qkv.pc under $scratch/prefix" >&2; exit 1; }
export PKG_CONFIG_PATH=$(dirname "$pc_file")
# shellcheck disable=SC2046 # the flags are words
gcc -std=c99 -Wall -Wextra -pedantic -Werror "$here/c_consumer/main.c" \
  $(pkg-config --cflags --libs qkv) -o "$scratch/consumer"
output=$(LD_LIBRARY_PATH="$(pkg-config --variable=libdir qkv):${LD_LIBRARY_PATH:-}" \
  "$scratch/consumer")
echo "$output"
version=$(sed -n 's/^project(qkv VERSION \([0-9.]*\).*/\1/p' "$here/../../CMakeLists.txt")
[ "$(pkg-config --modversion qkv)" = "$version" ] || {
  echo "pkg-config --modversion qkv: $(pkg-config --modversion qkv), expected $version" >&2
  exit 1
}
# softmax([1, 0]) = [e, 1] / (e + 1): out = w0·[1, 2] + w1·[3, 4], as the find_package consumer.
expected="qkv $version: 1.537883 2.537883"
[ "$output" = "$expected" ] || { echo "expected: $expected" >&2; exit 1; }
