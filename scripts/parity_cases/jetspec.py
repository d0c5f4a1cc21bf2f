"""JetSpec: a base exported with ``--jetspec-base`` and a JetSpec block draft exported with ``--jetspec-draft
--jetspec-draft-dir``: ``qwen3-jetspec`` on the DFlash case's dense Qwen3 base.

A JetSpec draft is a causal DFlash draft: its checkpoint is laid out as the DFlash case's (``parity_cases.dflash``;
``architectures: ["DFlashDraftModel"]``, its facts in ``dflash_config`` as the public JetSpec Qwen3 checkpoint stores
them, which Edge-LLM's exporter reads for ``jetspec_config``: ``config.py::make_jetspec_draft_config``) with
``causal_head: true``, and the exporter writes the DFlash graphs under ``llm/`` and ``jetspec_draft/``, with
``jetspec_config`` and ``jetspec_tree_base`` in their configs. What differs is the runtime's proposal mask: each block
row sees the committed positions and the block rows up to its own (``dflashRuntimeKernels.cu``:
``causalProposalMask``, ``bit <= i``).

The references (``reference.npz``) are the DFlash case's, the draft's blocks from
:class:`parity_cases.dflash.DFlashReference` with ``causal=True`` (block row ``i`` attends to the committed
positions and block rows ``0 .. i``).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from make_parity_fixtures import Case, Role

from parity_cases.dflash import BASE_BUILDER, DRAFT_BUILDER, SEQUENCES, _base, _draft, reference

TARGETS = [1, 3, 4]


def _checkpoint(folder: Path, seed: int) -> None:
    _base(folder / "base", seed)
    _draft(folder / "draft", seed, TARGETS, causal_head=True)


def export(ckpt: Path, out: Path) -> None:
    exe = Path(sys.executable).with_name("tensorrt-edgellm-export")
    args = [ckpt / "base", out, "--jetspec-base", "--jetspec-draft", "--jetspec-draft-dir", ckpt / "draft"]
    done = subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"tensorrt-edgellm-export failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")


NOTES = """Exported by one run of the real exporter: `tensorrt-edgellm-export CKPT/base OUT --jetspec-base
--jetspec-draft --jetspec-draft-dir CKPT/draft` (`OUT/llm` is the fixture's `base`, `OUT/jetspec_draft` its `draft`).
Transformers has no DFlash or JetSpec class: the draft's references come from
`scripts/parity_cases/dflash.py::DFlashReference` with `causal=True` (the draft's forward in torch with transformers'
Qwen3 parts, over Hugging Face's base hidden states, each block row seeing the rows before it)."""

ROLES = {"base": Role("llm", BASE_BUILDER, "base", "jetspec", checkpoint="base"),
         "draft": Role("jetspec_draft", DRAFT_BUILDER, "draft", "jetspec", checkpoint="draft")}

CASES = [
    Case("qwen3-jetspec", "JetSpec pair: the DFlash case's Qwen3 base (6 layers of 64, QK norm, vocab 512; target "
         "layers 1, 3, 4) and a one-layer causal DFlash (JetSpec, causal_head true) block draft of 4 rows, mask "
         "token 511.",
         _checkpoint, ROLES, export=export, sequences=SEQUENCES, reference=reference, notes=NOTES,
         extra={"target_layer_ids": TARGETS, "causal": True}),
]
