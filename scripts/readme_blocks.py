"""The README's code blocks and what CI does with each, by the HTML comment before it.

Every fenced block of README.md has one marker on the line before it (``tests/test_readme.py`` checks that):

* ``<!-- ci:main-command -->``, ``<!-- ci:test-command -->``, ``<!-- ci:docs-command -->``: run as they are by
  ``.ci/run`` (one block each);
* ``<!-- ci:wheel -->``: run by ``scripts/check_wheel.sh`` from an unrelated folder, with a wheel of the checkout
  installed in a fresh virtual environment (``python3`` is that environment's);
* ``<!-- ci:checkout -->``: run by ``tests/test_readme.py`` from the checkout;
* ``<!-- ci:stand-in: WHY -->``: needs what CI has not (WHY); ``tests/test_readme.py`` runs it on a toy directory
  whose engines are stand-ins;
* ``<!-- ci:not-run: WHY -->``: needs what CI has not (WHY); ``tests/test_readme.py`` checks that its ``trtio``
  command lines parse, its extras and markers exist and the files it names are there.

    python3 scripts/readme_blocks.py command ci:test-command     # the block's text
    python3 scripts/readme_blocks.py write ci:wheel DIR          # each block as DIR/NN.py or DIR/NN.sh
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
KINDS = ("ci:main-command", "ci:test-command", "ci:docs-command", "ci:wheel", "ci:checkout", "ci:stand-in",
         "ci:not-run")
_FENCE = re.compile(r"^```(\w*)\s*$")
_MARKER = re.compile(r"^<!-- (ci:[a-z-]+)(?::\s*(.*?))? -->$")


@dataclass(frozen=True)
class Block:
    """One fenced block: its marker (None where the line before holds none), the reason given with it, its
    language and text, and the README line its fence opens on (1-based)."""

    kind: str | None
    reason: str
    lang: str
    text: str
    line: int


def blocks(path: Path = README) -> list[Block]:
    lines = path.read_text(encoding="utf-8").splitlines()
    found, i = [], 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "```"), None)
        if end is None:
            raise SystemExit(f"{path}:{i + 1}: a code block that is never closed")
        marker = _MARKER.match(lines[i - 1].strip()) if i else None
        found.append(Block(marker.group(1) if marker else None, (marker.group(2) or "") if marker else "",
                           fence.group(1), "\n".join(lines[i + 1:end]) + "\n", i + 1))
        i = end + 1
    return found


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "command":
        chosen = [b for b in blocks() if b.kind == argv[1]]
        if len(chosen) != 1:
            print(f"readme_blocks: {len(chosen)} blocks marked {argv[1]} in {README}, expected 1", file=sys.stderr)
            return 2
        sys.stdout.write(chosen[0].text)
        return 0
    if len(argv) == 3 and argv[0] == "write":
        out = Path(argv[2])
        out.mkdir(parents=True, exist_ok=True)
        for n, b in enumerate(b for b in blocks() if b.kind == argv[1]):
            suffix = {"python": ".py", "bash": ".sh"}.get(b.lang)
            if suffix is None:
                print(f"readme_blocks: README.md:{b.line}: a {argv[1]} block must be python or bash", file=sys.stderr)
                return 2
            (out / f"{n:02d}{suffix}").write_text(b.text, encoding="utf-8")
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
