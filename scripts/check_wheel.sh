#!/usr/bin/env bash
# A wheel of this checkout, installed into a fresh virtual environment, works from an unrelated folder as the
# README says: the demo, `trtio generate toy-llm-ragged` (and toy-vlm-ragged with an image), the README's ci:wheel
# blocks (its Python snippets included: scripts/readme_blocks.py), with the toy engines coming from the package data, never from a checkout.
# The wheel itself: no build outputs (trtio/_engines/build/, plans), each toy asset once, the LICENSE.
# Run by .ci/run; takes about a minute (the venv installs numpy, cuda-python and tokenizers).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
say() { printf 'check_wheel: %s\n' "$*"; }

# The wheel is built from a copy of what git sees (tracked files and untracked ones it does not ignore, links kept
# as links): a build/ folder or built plans lying in the checkout cannot slip into it.
mkdir "$work/src"
git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf - | tar -xf - -C "$work/src"
(cd "$work/src" && python3 -m pip wheel -q --no-deps -w "$work/dist" .)
wheel=$(ls "$work"/dist/trtio-*.whl)

say "what the wheel holds: $(basename "$wheel")"
python3 - "$wheel" <<'PY'
import collections, hashlib, sys, zipfile

names = zipfile.ZipFile(sys.argv[1]).namelist()
z = zipfile.ZipFile(sys.argv[1])
built = [n for n in names if n.startswith("trtio/_engines/build/") or n.endswith((".plan", ".engine"))]
assert not built, f"build outputs in the wheel: {built}"
by_digest = collections.defaultdict(list)
for n in names:
    if n.startswith("trtio/_engines/") and not n.endswith("/"):
        by_digest[hashlib.sha256(z.read(n)).hexdigest()].append(n)
twice = [files for files in by_digest.values() if len(files) > 1]
assert not twice, f"the same toy file more than once: {twice}"
# The shared assets come once, from toy-assets/ (the toy directories link to them); a toy with a tokenizer of its
# own (toy-vlm-ragged's has image tokens) differs in content, which the digest check above already tells apart.
found = [n for n in names if n.endswith("/embedding.safetensors")]
assert found == ["trtio/_engines/toy-assets/embedding.safetensors"], f"embedding.safetensors: {found}"
for asset in ("tokenizer.json", "tokenizer_config.json"):
    assert f"trtio/_engines/toy-assets/{asset}" in names, f"{asset}: not in toy-assets/"
assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), "no LICENSE in the wheel"
print(f"check_wheel: {len(names)} files, no build output, each toy asset once, LICENSE")
PY

python3 -m venv "$work/venv"
"$work/venv/bin/python" -m pip install -q "$wheel[generate,vision]"
mkdir "$work/elsewhere"
cd "$work/elsewhere"
export TRTIO_CACHE_DIR="$work/cache"  # where the wheel lays its toy directories out
export PATH="$work/venv/bin:$PATH"    # python3 and trtio are the venv's
unset PYTHONPATH

say "trtio --version, demo"
trtio --version
trtio demo --max-new-tokens 8 > demo.txt
tail -n 1 demo.txt
tail -n 1 demo.txt | grep -q -- "-> OK$"
[ "$(wc -l < demo.txt)" -le 40 ] || { say "the demo printed $(wc -l < demo.txt) lines, more than 40"; exit 1; }

say "trtio generate toy-llm-ragged (the toy directory by name)"
trtio generate toy-llm-ragged --prompt "Once upon a time" --max-new-tokens 6 > generate.txt
grep -q "^Once upon a time" generate.txt

say "trtio generate toy-lora-ragged --lora chat (an adapter of the package data, by name)"
trtio generate toy-lora-ragged --lora chat --prompt "Once upon a time" --max-new-tokens 6 > lora.txt
grep -q "^Once upon a time" lora.txt

say "trtio generate toy-vlm-ragged --image (a PNG, read with the vision extra's Pillow)"
python3 -c "import numpy as np; from PIL import Image; Image.fromarray((np.arange(56 * 84 * 3) % 251).astype(np.uint8).reshape(56, 84, 3)).save('picture.png')"
trtio generate toy-vlm-ragged --image picture.png --prompt "Describe it." --max-new-tokens 6 > vision.txt
grep -q "^Describe it\." vision.txt

say "the README's ci:wheel blocks"
python3 "$root/scripts/readme_blocks.py" write ci:wheel "$work/blocks"
for block in "$work"/blocks/*; do
  say "README block $(basename "$block")"
  case "$block" in
    *.py) python3 "$block" ;;
    *.sh) bash -euo pipefail "$block" > "$block.out" ;;
  esac
done

python3 - <<'PY'
import os, trtio
from trtio.testing.toy_dirs import default_engines_dir

where = str(default_engines_dir())
assert "site-packages" not in trtio.__file__ or where.startswith(os.environ["TRTIO_CACHE_DIR"]), where
assert where.startswith(os.environ["TRTIO_CACHE_DIR"]), f"the toy directories came from {where}, not the wheel"
print(f"check_wheel: trtio {trtio.__version__} from {trtio.__file__}; toy directories laid out in {where}")
PY
