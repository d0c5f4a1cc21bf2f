"""TensorRT Edge-LLM 0.11 engine directories.

An Edge-LLM engine directory is flat: ``llm.engine`` + ``config.json`` for a plain LLM, or
``spec_base.engine`` + ``base_config.json`` and ``spec_draft.engine`` + ``draft_config.json`` for a
speculative (EAGLE3) pair. :class:`EngineDir` opens one (the configs alone open, for planning) and
reads what a runtime needs beside the engines (the token embedding table, an EAGLE3 pair's
draft-to-target map). Each config is read by ``LLMEngineConfig.from_edgellm``; the table of Edge-LLM
keys and trtio fields is in :mod:`trtio.edgellm_config`. What this module and the mapping assume
where Edge-LLM leaves meaning open is listed, with how to check it, in ``docs/edgellm-assumptions.md``.
Errors are :class:`~trtio.ConfigError` with the field ``"<file>: <dotted key>"`` (or the file alone).
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from trtio._checks import is_int
from trtio._json import read_json
from trtio._safetensors import SafeTensor, bf16_to_float32, e4m3_to_float32, read_safetensors
from trtio.config import DeploymentConfig, LLMEngineConfig, SpecDecodeConfig
from trtio.errors import ConfigError, InvalidTypeError

__all__ = ["EngineDir", "CONFIG_FILES", "ENGINE_FILES", "EMBEDDING_FILE", "D2T_FILE"]

#: The config and engine file of each role in an engine directory.
CONFIG_FILES = {"llm": "config.json", "base": "base_config.json", "draft": "draft_config.json"}
ENGINE_FILES = {"llm": "llm.engine", "base": "spec_base.engine", "draft": "spec_draft.engine"}
#: The token embedding table Edge-LLM's builder writes beside a plain LLM or a speculative base (the
#: EAGLE3 draft reads the base's).
EMBEDDING_FILE = "embedding.safetensors"
#: An EAGLE3 pair's draft-to-target vocabulary map (absent: the identity).
D2T_FILE = "d2t.safetensors"
_EMBEDDING_GROUP = 128  # columns per scale of an FP8 embedding table (Edge-LLM's writer)


# -- engine directories -----------------------------------------------------------------------

class EngineDir:
    """An Edge-LLM 0.11 engine directory, opened and checked: its kind, configs and engine paths.

    ``kind`` is ``"llm"`` (``config.json`` + ``llm.engine``) or ``"spec_decode"`` (``base_config.json``
    + ``spec_base.engine`` and ``draft_config.json`` + ``spec_draft.engine``). The configs are read and
    validated at :meth:`open`; the engines need not exist yet (planning from configs alone). Nothing is
    held open: an EngineDir is a value.
    """

    __slots__ = ("_path", "_kind", "_configs", "_raw")

    def __init__(self, path: Path, kind: str, configs: dict[str, LLMEngineConfig], raw: dict[str, Any]) -> None:
        self._path = path
        self._kind = kind
        self._configs = configs
        self._raw = raw

    # -- opening ------------------------------------------------------------------------------
    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> EngineDir:
        """Read and check the directory at ``path``; :class:`ConfigError` naming the file and key if it
        is not a usable Edge-LLM engine directory."""
        if not isinstance(path, (str, os.PathLike)):
            raise InvalidTypeError(f"EngineDir.open: expected the path of an engine directory, got "
                                   f"{type(path).__name__} {path!r}")
        root = Path(path)
        if not root.exists():
            raise ConfigError(str(root), "no such engine directory")
        if not root.is_dir():
            hint = ""
            if root.name in CONFIG_FILES.values():
                hint = (f"; pass its folder (EngineDir.open({str(root.parent)!r})) or read the file alone with "
                        "LLMEngineConfig.from_edgellm(path)")
            raise ConfigError(str(root), f"is a file, not an engine directory{hint}")
        kind = _kind_of(root)
        roles = ("llm",) if kind == "llm" else ("base", "draft")
        configs: dict[str, LLMEngineConfig] = {}
        raw: dict[str, Any] = {}
        for role in roles:
            file = root / CONFIG_FILES[role]
            data = read_json(file)
            _check_role(file, data, role)
            configs[role] = LLMEngineConfig.from_edgellm(data, what=str(file))
            raw[role] = data
        if kind == "spec_decode":
            _check_pair(root, configs["base"], configs["draft"])
        return cls(root, kind, configs, raw)

    # -- what it holds ------------------------------------------------------------------------
    @property
    def path(self) -> Path:
        return self._path

    @property
    def kind(self) -> str:
        """``"llm"`` or ``"spec_decode"``."""
        return self._kind

    @property
    def roles(self) -> tuple[str, ...]:
        """``("llm",)`` or ``("base", "draft")``."""
        return tuple(self._configs)

    @property
    def config(self) -> LLMEngineConfig:
        """The plain LLM's config (``kind == "llm"``)."""
        return self._config("llm")

    @property
    def base_config(self) -> LLMEngineConfig:
        """The speculative base's config (``kind == "spec_decode"``)."""
        return self._config("base")

    @property
    def draft_config(self) -> LLMEngineConfig:
        """The speculative draft's config (``kind == "spec_decode"``)."""
        return self._config("draft")

    def config_path(self, role: str) -> Path:
        """The config file of ``role``."""
        return self._path / CONFIG_FILES[self._role(role)]

    def engine_path(self, role: str) -> Path:
        """The engine (plan) file of ``role``: ``llm.engine``, ``spec_base.engine`` or ``spec_draft.engine``.
        It may not exist yet (a directory of configs opens for planning); see :attr:`has_engines`."""
        return self._path / ENGINE_FILES[self._role(role)]

    @property
    def has_engines(self) -> bool:
        """Whether every engine file of the directory is there."""
        return all(self.engine_path(role).is_file() for role in self.roles)

    def raw(self, role: str | None = None) -> dict[str, Any]:
        """The JSON of ``role``'s config as read (a copy); ``role`` may be left out for a plain LLM."""
        if role is None:
            if self._kind != "llm":
                raise ConfigError("role", f"{self._path} holds a speculative pair: ask for 'base' or 'draft'")
            role = "llm"
        return copy.deepcopy(dict(self._raw[self._role(role)]))

    def deployment(self, draft_top_k: int | None = None, draft_step: int | None = None,
                   verify_size: int | None = None) -> DeploymentConfig:
        """The :class:`DeploymentConfig` of this directory.

        A plain LLM takes no arguments. A speculative pair needs the three values Edge-LLM's runtime
        takes at run time: ``draft_top_k`` (candidates per drafted node), ``draft_step`` (draft levels
        per round) and ``verify_size`` (tree nodes the base verifies). They are checked against the
        configs' caps: ``verify_size <= builder_config.max_verify_tree_size`` of the base and
        ``draft_top_k x draft_step <= builder_config.max_draft_tree_size`` of the draft.
        """
        given = {"draft_top_k": draft_top_k, "draft_step": draft_step, "verify_size": verify_size}
        if self._kind == "llm":
            for name, value in given.items():
                if value is not None:
                    raise ConfigError(name, f"is for a speculative pair; {self._path} holds a plain LLM")
            return DeploymentConfig(self.config).validate()
        for name, value in given.items():
            if value is None:
                raise ConfigError(name, f"is required for the speculative pair in {self._path} (Edge-LLM takes "
                                        "draft_top_k, draft_step and verify_size at run time)")
            if not is_int(value) or value < 1:
                raise ConfigError(name, f"must be a positive int, got {value!r}")
        assert draft_top_k is not None and draft_step is not None and verify_size is not None
        base, draft = self.base_config, self.draft_config
        if verify_size > base.max_verify_tree_size:
            raise ConfigError("verify_size", f"{verify_size} exceeds builder_config.max_verify_tree_size "
                                             f"({base.max_verify_tree_size}) of {self.config_path('base')}")
        if draft_top_k * draft_step > draft.max_draft_tree_size:
            raise ConfigError("draft_top_k", f"draft_top_k x draft_step = {draft_top_k} x {draft_step} = "
                                             f"{draft_top_k * draft_step} exceeds builder_config.max_draft_tree_size "
                                             f"({draft.max_draft_tree_size}) of {self.config_path('draft')}: one "
                                             "proposal step drafts that many tokens")
        spec = SpecDecodeConfig(
            base_output_hidden_dim=draft.base_model_hidden_size, draft_hidden_size=draft.hidden_size,
            max_verify_size=base.max_verify_tree_size, max_draft_proposal_size=draft.max_draft_tree_size,
            drafting_top_k=draft_top_k, drafting_step=draft_step, verify_size=verify_size)
        return DeploymentConfig(base, draft, spec).validate()

    # -- runtime artifacts --------------------------------------------------------------------
    def embedding_table(self) -> np.ndarray:
        """The token embedding table Edge-LLM's runtime looks ``inputs_embeds`` up in: float16
        ``[rows, hidden_size]`` from ``embedding.safetensors`` (tensor ``"embedding"``).

        Edge-LLM's builder writes the table beside a plain LLM or a speculative base, already multiplied
        by the model's embedding scale; an EAGLE3 draft reads the base's table. An FP16 table comes back
        read-only (a memory map of a large file, valid while the file exists); an FP8 (e4m3) table and its
        ``"embedding_scale"`` (float32, one per 128 columns of a row) are dequantized, and BF16 / FP32
        tables converted, into a new array owned by the caller. Raises :class:`~trtio.ConfigError` naming
        the file where it is absent (a build that leaves the embedding in the checkpoint writes none),
        malformed, or not ``hidden_size`` wide.
        """
        role = "llm" if self._kind == "llm" else "base"
        file = self._path / EMBEDDING_FILE
        if not file.is_file():
            hint = ""
            if "checkpoint_weight_bindings" in self._raw[role]:
                hint = (f"; {CONFIG_FILES[role]} has checkpoint_weight_bindings: the builder may have left the "
                        "embedding in the checkpoint, where Edge-LLM's runtime reads it and trtio does not")
            raise ConfigError(str(file), f"no such file (Edge-LLM's builder writes the token embedding table "
                                         f"here){hint}")
        tensors = read_safetensors(file)
        if "embedding" not in tensors:
            raise ConfigError(str(file), f"holds no tensor 'embedding' (it holds {sorted(tensors)})")
        table = tensors["embedding"]
        hidden = self._configs[role].hidden_size
        if table.array.ndim != 2 or table.array.shape[1] != hidden:
            raise ConfigError(f"{file}: embedding", f"expected [vocab, {hidden}] (hidden_size of "
                                                    f"{CONFIG_FILES[role]}), got {table.dtype} "
                                                    f"{list(table.array.shape)}")
        return _embedding_float16(file, table, tensors.get("embedding_scale"))

    def draft_to_target(self) -> np.ndarray:
        """int64 ``[draft vocab]``: the base token id of each column of the draft's logits (EAGLE3).

        Read from ``d2t.safetensors`` (one 1-D integer tensor of ``draft_vocab_size`` entries) and read as
        Edge-LLM 0.11's runtime reads it: older exports store offsets (target = draft id + value), newer
        ones the target ids themselves; a table valid only one way is read that way, and one valid both
        ways as offsets only where that reaches more distinct target ids. Without the file the map is the
        identity (Edge-LLM's zero offsets). Raises :class:`~trtio.ConfigError` for a plain LLM directory or
        a table that is malformed or maps outside the base's ``vocab_size``.
        """
        if self._kind != "spec_decode":
            raise ConfigError(str(self._path), f"holds a {self._kind} engine; only a speculative pair has a "
                                               "draft-to-target map")
        draft_vocab = self.draft_config.output_vocab_size
        vocab = self.base_config.vocab_size
        file = self._path / D2T_FILE
        if not file.is_file():
            return np.arange(draft_vocab, dtype=np.int64)
        tensors = read_safetensors(file)
        if len(tensors) != 1:
            raise ConfigError(str(file), f"expected exactly one tensor (the map), it holds {sorted(tensors)}")
        (name, table), = tensors.items()
        if table.dtype not in ("I32", "I64") or table.array.shape != (draft_vocab,):
            raise ConfigError(f"{file}: {name}", f"expected an I32 or I64 tensor of draft_vocab_size = {draft_vocab} "
                                                 f"entries ({CONFIG_FILES['draft']}), got {table.dtype} "
                                                 f"{list(table.array.shape)}")
        raw = np.asarray(table.array, dtype=np.int64)
        ids = np.arange(draft_vocab, dtype=np.int64)
        direct_ok = bool(((raw >= 0) & (raw < vocab)).all())
        shifted = ids + raw
        offset_ok = bool(((shifted >= 0) & (shifted < vocab)).all())
        if not (direct_ok or offset_ok):
            bad = int(np.flatnonzero((raw < 0) | (raw >= vocab))[0])
            raise ConfigError(f"{file}: {name}", f"maps outside the base's vocab_size ({vocab}) read either way: "
                                                 f"entry {bad} is {int(raw[bad])}, as an offset "
                                                 f"{int(shifted[bad])}")
        if offset_ok and (not direct_ok or np.unique(shifted).size > np.unique(raw).size):
            return shifted
        return raw

    def __iter__(self) -> Iterator[tuple[str, LLMEngineConfig]]:
        """(role, config) pairs, base before draft."""
        return iter(self._configs.items())

    def __repr__(self) -> str:
        engines = "engines present" if self.has_engines else "configs only"
        return f"EngineDir({str(self._path)!r}, kind={self._kind!r}, {engines})"

    # -- helpers ------------------------------------------------------------------------------
    def _role(self, role: str) -> str:
        if role not in self._configs:
            raise ConfigError("role", f"expected one of {list(self._configs)} for the {self._kind} directory "
                                      f"{self._path}, got {role!r}")
        return role

    def _config(self, role: str) -> LLMEngineConfig:
        if role not in self._configs:
            other = "config" if self._kind == "llm" else "base_config / draft_config"
            raise ConfigError(CONFIG_FILES[role], f"{self._path} is a {self._kind} directory without it; use .{other}")
        return self._configs[role]


def _embedding_float16(file: Path, table: SafeTensor, scale: SafeTensor | None) -> np.ndarray:
    """An embedding table as float16 [rows, hidden]: FP16 as stored, FP8 dequantized with its scales."""
    raw = table.array
    if table.dtype == "F16":
        return raw
    if table.dtype in ("F32", "BF16"):
        return (bf16_to_float32(raw) if table.dtype == "BF16" else raw).astype(np.float16)
    if table.dtype != "F8_E4M3":
        raise ConfigError(f"{file}: embedding", f"expected F16, BF16, F32 or F8_E4M3 elements, got {table.dtype}")
    rows, hidden = raw.shape
    groups = hidden // _EMBEDDING_GROUP
    if scale is None or hidden % _EMBEDDING_GROUP or scale.array.shape != (rows, groups) or scale.dtype != "F32":
        got = "none" if scale is None else f"{scale.dtype} {list(scale.array.shape)}"
        raise ConfigError(f"{file}: embedding_scale", f"an F8_E4M3 table [{rows}, {hidden}] needs F32 scales "
                                                      f"[{rows}, {hidden} / {_EMBEDDING_GROUP}], got {got}")
    out = np.empty((rows, hidden), np.float16)
    for start in range(0, rows, 4096):  # bounded float32 temporaries for a large vocabulary
        stop = min(rows, start + 4096)
        values = e4m3_to_float32(raw[start:stop]).reshape(stop - start, groups, _EMBEDDING_GROUP)
        out[start:stop] = (values * scale.array[start:stop, :, None]).reshape(stop - start, hidden)
    return out


def _kind_of(root: Path) -> str:
    present = {name for name in (*CONFIG_FILES.values(), *ENGINE_FILES.values()) if (root / name).is_file()}
    llm_files = sorted(present & {CONFIG_FILES["llm"], ENGINE_FILES["llm"]})
    spec_files = sorted(present - set(llm_files))
    if llm_files and spec_files:
        raise ConfigError(str(root), f"holds both a plain LLM ({', '.join(llm_files)}) and a speculative pair "
                                     f"({', '.join(spec_files)}); an engine directory holds one deployment")
    if spec_files:
        for a, b in (("base", "draft"), ("draft", "base")):
            if CONFIG_FILES[a] in present and CONFIG_FILES[b] not in present:
                raise ConfigError(str(root / CONFIG_FILES[b]),
                                  f"is missing: {CONFIG_FILES[a]} is here without it; a speculative directory needs "
                                  f"{CONFIG_FILES['base']} and {CONFIG_FILES['draft']}")
            if ENGINE_FILES[a] in present and ENGINE_FILES[b] not in present:
                raise ConfigError(str(root / ENGINE_FILES[b]),
                                  f"is missing: {ENGINE_FILES[a]} is here without it; a speculative directory holds "
                                  "both engines (or, to plan from the configs alone, neither)")
        if CONFIG_FILES["base"] not in present:
            raise ConfigError(str(root / CONFIG_FILES["base"]),
                              f"is missing: the engines need the {CONFIG_FILES['base']} and {CONFIG_FILES['draft']} "
                              "their builder wrote beside them")
        return "spec_decode"
    if llm_files:
        if CONFIG_FILES["llm"] not in present:
            raise ConfigError(str(root / CONFIG_FILES["llm"]),
                              f"is missing: {ENGINE_FILES['llm']} needs the config.json its builder wrote beside it")
        return "llm"
    tp = sorted(p.name for p in root.glob("config_world*.json"))
    if tp:
        raise ConfigError(str(root / tp[0]), "is a tensor-parallel engine config; tensor-parallel directories "
                                             "(one engine per rank) are not supported by trtio yet")
    if (root / "dllm.engine").is_file():
        raise ConfigError(str(root / "dllm.engine"), "is a diffusion LLM engine; trtio has no block-diffusion "
                                                     "step protocol")
    raise ConfigError(str(root), "holds no Edge-LLM engine config: expected config.json (+ llm.engine) for a plain "
                                 "LLM, or base_config.json + draft_config.json (+ spec_base.engine, "
                                 "spec_draft.engine) for a speculative pair")


def _check_role(file: Path, data: Any, role: str) -> None:
    """Refuse a config whose ``engine_role`` is not the one its file name holds."""
    if not isinstance(data, Mapping):
        return  # LLMEngineConfig.from_edgellm names it
    found = data.get("engine_role")
    if isinstance(found, str) and found in CONFIG_FILES and found != role:
        holds = {"llm": "a plain LLM's config", "base": "the speculative base's config",
                 "draft": "the speculative draft's config"}[role]
        raise ConfigError(f"{file}: engine_role", f"is {found!r}, but {file.name} holds {holds} (expected "
                                                  f"{role!r}); Edge-LLM writes {CONFIG_FILES[found]} for a "
                                                  f"{found!r} engine")


def _check_pair(root: Path, base: LLMEngineConfig, draft: LLMEngineConfig) -> None:
    """The base and the draft must be one deployment; name the numbers that disagree."""
    bfile, dfile = root / CONFIG_FILES["base"], root / CONFIG_FILES["draft"]
    btype, dtype = base.extras.get("spec_decode_type"), draft.extras.get("spec_decode_type")
    if btype != dtype:
        raise ConfigError(f"{dfile}: spec_decode_type", f"is {dtype!r}, but {bfile.name} says {btype!r}; base and "
                                                        "draft must be one speculative family")
    n = len(base.eagle_hidden_state_layers) or 3  # EAGLE3 feeds 3 base layers to its draft
    layers = (f"the {n} layers of eagle_hidden_state_layers {list(base.eagle_hidden_state_layers)}"
              if base.eagle_hidden_state_layers else f"{n} layers (EAGLE3's count; {bfile.name} names none)")
    if draft.base_model_hidden_size != n * base.hidden_size:
        raise ConfigError(f"{dfile}: base_model_hidden_size",
                          f"{draft.base_model_hidden_size} does not match the base: {bfile.name} feeds the draft "
                          f"{layers} of hidden_size {base.hidden_size}, {n} x {base.hidden_size} = "
                          f"{n * base.hidden_size}")
    # The KV page size needs no check: Edge-LLM fixes it at 128 for both.
    if draft.max_supported_batch_size != base.max_supported_batch_size:
        raise ConfigError(f"{dfile}: builder_config.max_batch_size",
                          f"{draft.max_supported_batch_size} differs from the base's {base.max_supported_batch_size} "
                          f"({bfile.name}); base and draft run the same sequences, and Edge-LLM's builder writes one "
                          "batch size for both")
    if draft.output_vocab_size > base.vocab_size:
        raise ConfigError(f"{dfile}: draft_vocab_size", f"{draft.output_vocab_size} exceeds the base's vocab_size "
                                                        f"({base.vocab_size}, {bfile.name}); draft tokens map onto "
                                                        "base tokens")
    if draft.is_mrope and not base.is_mrope:
        raise ConfigError(f"{dfile}: rope_scaling", f"uses MRoPE but the base ({bfile.name}) does not")
