#!/usr/bin/env bash
# Creates the project's virtual environment .venv/ and installs requirements.txt into it, from
# PyPI, exactly as pinned. Idempotent: does nothing when .venv/ already holds this
# requirements.txt (its hash is kept in .venv/requirements.sha256).
#   scripts/install-python-deps.sh            the base interpreter is `python3` on the PATH
#   QKV_BASE_PYTHON=/path/to/python3 scripts/install-python-deps.sh
# The tests, the oracle cases and the Python module all use .venv/bin/python (CMake finds it).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="$root/.venv"
base=${QKV_BASE_PYTHON:-python3}
wanted=$(sha256sum "$root/requirements.txt" | cut -d' ' -f1)
if [ -x "$venv/bin/python" ] && [ "$(cat "$venv/requirements.sha256" 2>/dev/null)" = "$wanted" ]; then
  exit 0
fi
if [ ! -x "$venv/bin/python" ]; then
  "$base" -m venv "$venv"
fi
# The hash is written last: an interrupted install is redone on the next run.
rm -f "$venv/requirements.sha256"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$root/requirements.txt"
echo "$wanted" > "$venv/requirements.sha256"
echo "install-python-deps: $("$venv/bin/python" --version) in $venv with requirements.txt"
