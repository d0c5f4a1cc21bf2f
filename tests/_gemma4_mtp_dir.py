"""Test helper: the real Gemma 4 MTP export of the parity fixture (``tests/fixtures/parity/gemma4-mtp``) laid out as
an Edge-LLM 0.11 engine directory of a speculative pair, as the builder writes it: ``base_config.json`` and
``draft_config.json`` (the export's configs with the builder's ``builder_config``, ``layer_types`` as the builder
writes them), ``embedding.safetensors`` and ``ple_embedding.safetensors`` (the target's), a ``tokenizer.json`` and
empty ``spec_base.engine`` / ``spec_draft.engine``; and a stand-in for :func:`trtio.load_engine` giving each engine
file its exported ONNX graph (an :class:`~trtio.testing.OnnxEngine`): NVIDIA's real graphs, run on the host.

The tokenizer is the word-level one of ``tests/_asr_dir.py`` over the fixture's 512 ids (``t0`` .. ``t511``): a
prompt ``"t475 t357 ..."`` is exactly the fixture's prompt ids.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests._asr_dir import word_tokenizer
from tests._parity import Case
from trtio.errors import UnknownNameError

CASE = "gemma4-mtp"


def built_config(config: dict[str, Any]) -> dict[str, Any]:
    """An exported ``config.json`` as Edge-LLM's builder writes it beside the engine: every layer that is not
    recurrent is ``"attention"`` in ``layer_types`` (``experimental/builder/core/config.py::_parse_layer_types``;
    the exporter of a ``gemma4_mtp`` pair leaves Hugging Face's ``sliding_attention`` / ``full_attention`` there,
    which ``attention_layer_types`` keeps)."""
    out = dict(config)
    out["layer_types"] = ["attention"] * len(out["layer_types"])
    return out


def mtp_directory(root: Path, case: Case | None = None, eos: int | None = None) -> Path:
    """Write the directory at ``root`` (module docstring; ``eos``: the base config's ``eos_token_id`` where given);
    returns ``root``."""
    case = case or Case(CASE)
    root.mkdir(parents=True, exist_ok=True)
    base = built_config(case.engine("base").config)
    if eos is not None:
        base["eos_token_id"] = eos
    (root / "base_config.json").write_text(json.dumps(base, indent=2))
    (root / "draft_config.json").write_text(json.dumps(built_config(case.engine("draft").config), indent=2))
    for table in ("embedding.safetensors", "ple_embedding.safetensors"):
        shutil.copy(case.root / "base" / table, root)
    word_tokenizer(int(base["vocab_size"])).save(str(root / "tokenizer.json"))
    (root / "spec_base.engine").write_bytes(b"")
    (root / "spec_draft.engine").write_bytes(b"")
    return root


def onnx_loader(root: Path, case: Case | None = None, loaded: list[str] | None = None,
                backend: str = "host") -> Callable[..., Any]:
    """A stand-in for ``load_engine`` (patch ``trtio._setups.engine_dir.load_engine``): ``spec_base.engine`` and
    ``spec_draft.engine`` of ``root`` give the export's graphs (their tensors on ``backend``); the roles loaded are
    appended to ``loaded``."""
    case = case or Case(CASE)
    roles = {root / "spec_base.engine": "base", root / "spec_draft.engine": "draft"}

    def load(path: Any, module: Any = "auto", *, plugins: Any = ()) -> Any:
        role = roles.get(Path(path))
        if role is None:
            raise UnknownNameError(f"{path} is not an engine of {root}")
        if loaded is not None:
            loaded.append(role)
        return case.engine(role, backend)

    return load
