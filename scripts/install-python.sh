#!/usr/bin/env bash
# Installs the built Python package (BUILD/python/qkv: the .py files and the extension, which
# carries the whole library) for the current user, where /usr/bin/python3 finds it:
#   scripts/install-python.sh [BUILD] [SITE]
# BUILD defaults to build/, SITE to the user's site-packages (python3 -m site --user-site).
set -euo pipefail
build=${1:-build}
python=${PYTHON:-/usr/bin/python3}
site=${2:-$("$python" -m site --user-site)}
package="$build/python/qkv"
if ! ls "$package"/_qkv*.so >/dev/null 2>&1; then
  echo "install-python: $package has no extension module (run 'make' first)" >&2
  exit 1
fi
mkdir -p "$site"
# Into a fresh folder beside the old one, then renamed over it: an interrupted install leaves
# the previous one whole.
staging=$(mktemp -d "$site/.qkv-install.XXXXXX")
chmod 755 "$staging"
trap 'rm -rf "$staging"' EXIT
cp "$package"/*.py "$package"/_qkv*.so "$staging/"
rm -rf "$site/qkv.old"
[ -e "$site/qkv" ] && mv "$site/qkv" "$site/qkv.old"
mv "$staging" "$site/qkv"
rm -rf "$site/qkv.old"
trap - EXIT
installed=$("$python" -c 'import sys; sys.path.insert(0, sys.argv[1]); import qkv
print(qkv.__version__, qkv.__file__)' "$site")
echo "qkv $installed installed"
