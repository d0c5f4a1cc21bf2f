#!/usr/bin/env bash
# A wheel of this checkout, installed into a fresh virtual environment, runs `trtio demo` from an
# unrelated folder: the toy engine definitions must come from the package data, not from a source tree.
# Run by .ci/run; takes about a minute (the venv installs numpy and cuda-python).
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m pip wheel -q --no-deps -w "$work/dist" .
python3 -m venv "$work/venv"
"$work/venv/bin/python" -m pip install -q "$work"/dist/trtio-*.whl
mkdir "$work/elsewhere"
cd "$work/elsewhere"
"$work/venv/bin/trtio" demo --max-new-tokens 8 > demo.txt
grep -q "spec-decode tokens equal vanilla tokens: yes" demo.txt
"$work/venv/bin/python" - <<'PY'
import pathlib, trtio
from trtio.testing.toy_engines import default_engines_dir
where = default_engines_dir()
assert "site-packages" in str(where), f"the demo read {where}, not the installed package data"
print(f"check_wheel: trtio {trtio.__version__} from a wheel ran the demo with {where}")
PY
