"""TensorRT Edge-LLM 0.11 engine directories.

An Edge-LLM engine directory is flat: ``llm.engine`` + ``config.json`` for a plain LLM,
``spec_base.engine`` + ``base_config.json`` and ``spec_draft.engine`` + ``draft_config.json`` for a
speculative (EAGLE3) pair, or, for a plain LLM built across N GPUs (tensor parallelism), one engine per rank
(``llm_world{N}_rank{R}.engine``) and one ``config_world{N}.json`` whose top-level keys describe the whole model
and whose ``rank_configs[r].config_overrides`` give rank r's heads, KV heads and MLP width. :class:`EngineDir`
opens one (the configs alone open, for planning) and reads what a runtime needs beside the engines (the
token embedding table, an EAGLE3 pair's draft-to-target map, weights the engines left in the checkpoint).
Each config is read by ``LLMEngineConfig.from_edgellm`` (a tensor-parallel one, the whole model's and each
rank's, by the same mapping); the table of Edge-LLM keys and trtio fields is in :mod:`trtio._edgellm_config`.
What this module and the mapping assume where Edge-LLM leaves meaning open is listed, with how to check
it, in ``docs/edgellm-assumptions.md``.
Errors are :class:`~trtio.ConfigError` with the field ``"<file>: <dotted key>"`` (or the file alone).
"""

from __future__ import annotations

import copy
import dataclasses
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from trtio._checkpoint import BINDINGS_KEY, CheckpointBinding, checkpoint_directory, parse_bindings, read_weights
from trtio._checks import is_int
from trtio._config import DeploymentConfig, LLMEngineConfig, SpecDecodeConfig
from trtio._cuda.backend import Backend
from trtio._edgellm_config import map_edgellm_config
from trtio._embeddings import TokenEmbeddings
from trtio._json import read_json
from trtio._safetensors import SafeTensor, bf16_to_float32, e4m3_to_float32, read_safetensors
from trtio._stream import StreamLike
from trtio.errors import ConfigError, InvalidTypeError
from trtio.features import component_folders, component_named, components, family_configs

__all__ = ["EngineDir", "CONFIG_FILES", "ENGINE_FILES", "EMBEDDING_FILE", "D2T_FILE", "SHARDED_KEYS",
           "TP_CONFIG_PATTERN"]

#: The config and engine file of each role in an engine directory.
CONFIG_FILES = {"llm": "config.json", "base": "base_config.json", "draft": "draft_config.json"}
ENGINE_FILES = {"llm": "llm.engine", "base": "spec_base.engine", "draft": "spec_draft.engine"}
#: The token embedding table Edge-LLM's builder writes beside a plain LLM or a speculative base (the
#: EAGLE3 draft reads the base's).
EMBEDDING_FILE = "embedding.safetensors"
#: An EAGLE3 pair's draft-to-target vocabulary map (absent: the identity).
D2T_FILE = "d2t.safetensors"
_EMBEDDING_GROUP = 128  # columns per scale of an FP8 embedding table (Edge-LLM's writer)
#: A vision-language model's encoder: its folder, its engine file and the role :meth:`EngineDir.engine_path` takes.
#: A tensor-parallel directory's config: ``config_world{N}.json`` (N ranks).
TP_CONFIG_PATTERN = re.compile(r"config_world(\d+)\.json")
#: The keys Edge-LLM 0.11's writer shards across ranks (``_tp_rank_overrides``): the only keys a rank's
#: ``config_overrides`` may change.
SHARDED_KEYS = ("num_attention_heads", "num_key_value_heads", "intermediate_size", "recurrent_state_num_heads",
                "conv_dim", "kv_layer_configs")


@dataclass(frozen=True)
class _Ranks:
    """A tensor-parallel directory's ranks: its config file, each rank's engine file name and config."""

    file: Path
    engines: tuple[str, ...]
    configs: tuple[LLMEngineConfig, ...]

    @property
    def size(self) -> int:
        return len(self.engines)


# -- engine directories -----------------------------------------------------------------------

class EngineDir:
    """An Edge-LLM 0.11 engine directory, opened and checked: its kind, configs and engine paths.

    ``kind`` is ``"llm"`` (``config.json`` + ``llm.engine``, or a tensor-parallel ``config_world{N}.json`` +
    one engine per rank) or ``"spec_decode"`` (``base_config.json`` + ``spec_base.engine`` and
    ``draft_config.json`` + ``spec_draft.engine``). The configs are read and validated at :meth:`open`; the
    engines need not exist yet (planning from configs alone). Nothing is held open: an EngineDir is a value.

    A tensor-parallel directory has :attr:`tp_size` N > 1 (or a ``config_world1.json``): :attr:`config` is
    the whole model, :meth:`rank_config` each rank's view of it (the rank's heads, KV heads and MLP width)
    and :meth:`engine_path` takes the rank. Other directories have ``tp_size`` 1 and one rank, rank 0.
    """

    __slots__ = ("_path", "_kind", "_configs", "_raw", "_ranks", "_components")

    def __init__(self, path: Path, kind: str, configs: dict[str, LLMEngineConfig], raw: dict[str, Any],
                 ranks: _Ranks | None = None, components: Mapping[str, Any] | None = None) -> None:
        self._path = path
        self._kind = kind
        self._configs = configs
        self._raw = raw
        self._ranks = ranks
        self._components = dict(components or {})  # component name -> its config (trtio.features.Component)

    # -- opening ------------------------------------------------------------------------------
    @classmethod
    def open(cls, path: str | os.PathLike[str], *, components: Sequence[str] | None = None) -> EngineDir:
        """Read and check the directory at ``path``; :class:`ConfigError` naming the file and key if it
        is not a usable Edge-LLM engine directory.

        The engines beside the LLM (its folders: ``visual/``, ...) are read through the component table
        (:mod:`trtio.components.component_table`), each checked against the LLM's config. ``components``: the names
        of the components to open (``"llm"`` for the LLM or the speculative pair itself, always opened; a
        component's name, e.g. ``"visual"``); None opens every one the directory holds, and then a folder holding
        an engine or a config that no component binds (Qwen3-Omni's speech output: ``talker/``, ``code_predictor/``,
        ``code2wav/``, ...) is refused, naming each such folder, rather than ignored."""
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
        wanted = _wanted_components(components)
        kind = _kind_of(root)
        if kind == "tensor_parallel":
            return cls._open_tensor_parallel(root, wanted)
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
            configs["base"] = _check_pair(root, configs["base"], configs["draft"])
        return cls(root, kind, configs, raw,
                   components=_components(root, configs["llm" if kind == "llm" else "base"], wanted))

    @classmethod
    def _open_tensor_parallel(cls, root: Path, wanted: set[str] | None) -> EngineDir:
        file = _tp_config_file(root)
        data = read_json(file)
        whole, ranks = _read_ranks(file, data)
        return cls(root, "llm", {"llm": whole}, {"llm": data}, ranks, components=_components(root, whole, wanted))

    # -- what it holds ------------------------------------------------------------------------
    @property
    def path(self) -> Path:
        return self._path

    @property
    def tp_size(self) -> int:
        """Ranks (GPUs) the directory's LLM is built for: N of ``config_world{N}.json``, else 1."""
        return 1 if self._ranks is None else self._ranks.size

    @property
    def is_tensor_parallel(self) -> bool:
        """Whether the directory is a tensor-parallel build (``config_world{N}.json``, one engine per rank)."""
        return self._ranks is not None

    def rank_config(self, rank: int) -> LLMEngineConfig:
        """Rank ``rank``'s config: the whole model's with the rank's ``config_overrides`` applied (its attention
        heads, KV heads and MLP width). A directory that is not tensor-parallel has rank 0 only: its
        :attr:`config`."""
        r = self._rank(rank)
        return self.config if self._ranks is None else self._ranks.configs[r]

    def checkpoint_bindings(self, role: str = "llm") -> tuple[CheckpointBinding, ...]:
        """The engine inputs the config of ``role`` fills from the model's checkpoint
        (``checkpoint_weight_bindings``, checked now; the runtime's embedding tables left out); empty for most
        directories."""
        role = self._role(role)
        return parse_bindings(self._raw[role].get(BINDINGS_KEY), str(self.config_path(role)), self.tp_size)

    def checkpoint_weights(self, checkpoint_dir: str | os.PathLike[str] | None = None,
                           role: str = "llm") -> list[dict[str, np.ndarray]]:
        """Each rank's weight inputs (``[rank][engine input name]``: host arrays of the binding's dtype and
        rank-local shape), read once from the checkpoint's safetensors files: ``checkpoint_dir`` where given,
        else the config's ``checkpoint_dir`` (relative to this directory). See :mod:`trtio._checkpoint`.
        One empty dict per rank where the engines bind no checkpoint weight."""
        bindings = self.checkpoint_bindings(role)
        if not bindings:
            return [{} for _ in range(self.tp_size)]
        where = str(self.config_path(role))
        directory = checkpoint_directory(self._path, self._raw[role].get("checkpoint_dir"), where, checkpoint_dir)
        return read_weights(bindings, directory, self.tp_size, where)

    @property
    def kind(self) -> str:
        """``"llm"`` or ``"spec_decode"``."""
        return self._kind

    @property
    def components(self) -> dict[str, Any]:
        """The engines beside the LLM this directory holds, opened: component name -> its config (a copy)."""
        return dict(self._components)

    @property
    def visual_config(self) -> Any:
        """The vision encoder's config (a :class:`~trtio.components.visual.visual_config.VisualConfig`:
        ``visual/config.json`` and ``visual/preprocessor_config.json``: a vision-language model's directory), None
        without ``visual/``. Read and checked at :meth:`open` against the LLM's config (its hidden size, deepstack
        features and MRoPE sections)."""
        return self._components.get("visual")

    @property
    def audio_config(self) -> Any:
        """The audio encoder's config (an :class:`~trtio.components.audio.audio_config.AudioConfig`:
        ``audio/config.json`` and ``audio/preprocessor_config.json``: a speech model's directory, Qwen3-ASR or
        Qwen3-Omni's thinker), None without ``audio/``. Read and checked at :meth:`open` against the LLM's config
        (its hidden size, the audio token ids, rope_theta)."""
        return self._components.get("audio")

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
        """The config file of ``role`` (a tensor-parallel directory's ``config_world{N}.json`` for ``"llm"``)."""
        role = self._role(role)
        return self._ranks.file if self._ranks is not None else self._path / CONFIG_FILES[role]

    def engine_path(self, role: str | int) -> Path:
        """The engine (plan) file of ``role`` (``llm.engine``, ``spec_base.engine``, ``spec_draft.engine``, or
        ``visual/visual.engine`` for ``"visual"``) or of a rank (an int: a tensor-parallel directory's
        ``rank_configs[r].engine``; rank 0 of another plain LLM directory is its ``llm.engine``). It may not exist
        yet (a directory of configs opens for planning); see :attr:`has_engines`."""
        component = component_named(role) if isinstance(role, str) else None
        if component is not None:  # an engine beside the LLM (visual/visual.engine)
            if role not in self._components:
                raise ConfigError("role", f"{self._path} has no {component.WHAT} ({component.FOLDER}/"
                                          f"{component.CONFIG_FILE})")
            return self._path / component.FOLDER / component.ENGINE_FILE
        if not isinstance(role, str) and is_int(role):
            r = self._rank(role)
            if self._ranks is not None:
                return self._path / self._ranks.engines[r]
            return self._path / ENGINE_FILES["llm"]
        if not isinstance(role, str):
            raise ConfigError("role", f"expected a role name or a rank (int), got {type(role).__name__} {role!r}")
        role = self._role(role)
        if self._ranks is not None:
            raise ConfigError("role", f"{self._path} is a tensor-parallel directory with one engine per rank: ask "
                                      f"for engine_path(0) .. engine_path({self.tp_size - 1})")
        return self._path / ENGINE_FILES[role]

    @property
    def engine_paths(self) -> tuple[Path, ...]:
        """Every engine file of the directory: one per role, or one per rank."""
        beside = tuple(self.engine_path(name) for name in self._components)
        if self._ranks is not None:
            return tuple(self._path / name for name in self._ranks.engines) + beside
        return tuple(self._path / ENGINE_FILES[role] for role in self.roles) + beside

    @property
    def has_engines(self) -> bool:
        """Whether every engine file of the directory is there."""
        return all(p.is_file() for p in self.engine_paths)

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
        the rows a draft step takes ``<= builder_config.max_draft_tree_size`` of the draft: an EAGLE-style tree's
        ``draft_top_k x draft_step``, or what the draft's family says its steps take
        (:meth:`~trtio._config.LLMEngineConfig.draft_rows`).
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
        rows = draft.draft_rows(draft_top_k, draft_step)  # an EAGLE-style tree's top_k x step, or its family's
        if rows > draft.max_draft_tree_size and rows == draft_top_k * draft_step:
            raise ConfigError("draft_top_k", f"draft_top_k x draft_step = {draft_top_k} x {draft_step} = "
                                             f"{draft_top_k * draft_step} exceeds builder_config.max_draft_tree_size "
                                             f"({draft.max_draft_tree_size}) of {self.config_path('draft')}: one "
                                             "proposal step drafts that many tokens")
        if rows > draft.max_draft_tree_size:
            raise ConfigError("draft_top_k", f"a round of draft_top_k {draft_top_k} x draft_step {draft_step} takes "
                                             f"{rows} rows a draft step, more than builder_config.max_draft_tree_size "
                                             f"({draft.max_draft_tree_size}) of {self.config_path('draft')}")
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
        return embedding_float16(file, table, tensors.get("embedding_scale"))

    def ple_embedding_table(self) -> np.ndarray | None:
        """The per-token table a family keeps beside the token embeddings (:meth:`FamilyConfig.token_table
        <trtio.features.FamilyConfig.token_table>`): Gemma 4's per-layer embedding table, float16
        ``[rows, L x ple_hidden]`` from ``ple_embedding.safetensors`` (tensor ``"weight"``, already scaled by its
        writer), read-only; None for a directory whose config has none. Raises :class:`~trtio.ConfigError` naming
        the file where it is absent or not ``L x ple_hidden`` wide."""
        cfg = self._configs.get("llm") if self._kind == "llm" else self._configs.get("base")
        for family in cfg.features if cfg is not None else ():
            table = family.token_table(cfg, self._path)
            if table is not None:
                found: np.ndarray = table
                return found
        return None

    def embeddings(self, backend: Backend | str | None = None, stream: StreamLike = None, *,
                   max_tokens: int | None = None) -> TokenEmbeddings:
        """The directory's token embeddings on the device: a :class:`~trtio._embeddings.TokenEmbeddings` over
        :meth:`embedding_table` (and :meth:`ple_embedding_table` where the config has per-layer embeddings), on
        ``backend``, uploaded on ``stream``; its ``embed(token_ids)`` gathers a step's ``inputs_embeds`` (and
        ``ple_embeds=``) in one kernel per table. ``max_tokens`` (default: the config's max batch x max input
        length; the base's for a speculative pair) bounds one gather. The caller closes it."""
        cfg = self.config if self._kind == "llm" else self.base_config
        tokens = max_tokens or cfg.max_supported_batch_size * cfg.max_supported_input_length
        return TokenEmbeddings(self.embedding_table(), self.ple_embedding_table(), stream, max_tokens=tokens,
                               backend=backend)

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
        tp = f", tp_size={self.tp_size}" if self._ranks is not None else ""
        beside = "".join(f", {name}={getattr(cfg, 'model_type', type(cfg).__name__)!r}"
                         for name, cfg in self._components.items())
        return f"EngineDir({str(self._path)!r}, kind={self._kind!r}{tp}{beside}, {engines})"

    # -- helpers ------------------------------------------------------------------------------
    def _rank(self, rank: Any) -> int:
        if not is_int(rank) or not 0 <= int(rank) < self.tp_size:
            raise ConfigError("rank", f"expected a rank in 0..{self.tp_size - 1} of {self._path} (tp_size "
                                      f"{self.tp_size}), got {rank!r}")
        if self._kind != "llm":
            raise ConfigError("rank", f"{self._path} holds a speculative pair: ask for the 'base' or 'draft' role")
        return int(rank)
    def _role(self, role: str) -> str:
        if not isinstance(role, str) or role not in self._configs:
            raise ConfigError("role", f"expected one of {list(self._configs)} for the {self._kind} directory "
                                      f"{self._path}, got {role!r}")
        return role

    def _config(self, role: str) -> LLMEngineConfig:
        if not isinstance(role, str) or role not in self._configs:
            other = "config" if self._kind == "llm" else "base_config / draft_config"
            raise ConfigError(CONFIG_FILES[role], f"{self._path} is a {self._kind} directory without it; use .{other}")
        return self._configs[role]


def embedding_float16(file: Path, table: SafeTensor, scale: SafeTensor | None) -> np.ndarray:
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
    tp = sorted(p.name for p in root.iterdir() if TP_CONFIG_PATTERN.fullmatch(p.name) and p.is_file())
    if tp and present:
        raise ConfigError(str(root), f"holds both a tensor-parallel build ({', '.join(tp)}) and "
                                     f"{', '.join(sorted(present))}; an engine directory holds one deployment")
    if tp:
        return "tensor_parallel"
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
    if (root / "dllm.engine").is_file():
        raise ConfigError(str(root / "dllm.engine"), "is a diffusion LLM engine; trtio has no block-diffusion "
                                                     "step protocol")
    raise ConfigError(str(root), "holds no Edge-LLM engine config: expected config.json (+ llm.engine) for a plain "
                                 "LLM, base_config.json + draft_config.json (+ spec_base.engine, "
                                 "spec_draft.engine) for a speculative pair, or config_world{N}.json (+ one engine "
                                 "per rank) for a tensor-parallel LLM")


def _wanted_components(names: Sequence[str] | None) -> set[str] | None:
    """The components ``EngineDir.open(components=...)`` asks for (None: every one the directory holds), checked:
    ``"llm"`` or a registered component's name."""
    if names is None:
        return None
    if isinstance(names, str) or not all(isinstance(n, str) for n in names):
        raise InvalidTypeError(f"components: expected a sequence of component names, got {names!r}")
    known = ("llm", *(c.NAME for c in components()))
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ConfigError("components", f"{unknown[0]!r} is not a component trtio binds (it binds {list(known)})")
    return set(names)


def _components(root: Path, llm: LLMEngineConfig, wanted: set[str] | None) -> dict[str, Any]:
    """The configs of the components beside the LLM at ``root`` (``wanted``: those asked for; None: every one),
    each read by its component and checked against ``llm``. Opening every one (``wanted`` None), a folder holding an
    engine or a config that no component binds is refused, naming it: it is an engine trtio would leave out."""
    found: dict[str, Any] = {}
    bound = component_folders()
    folders = sorted(p for p in root.iterdir() if p.is_dir())
    unbound = [f for f in folders if f.name not in bound and _holds_an_engine(f)]
    if wanted is None and unbound:
        names = ", ".join(f"{f.name}/" for f in unbound)
        what = "an engine" if len(unbound) == 1 else "engines"
        raise ConfigError(f"{unbound[0]}", f"holds {what} beside the LLM ({names}) that trtio does not bind (its "
                                           f"component table binds {sorted(bound)}); refused rather than left out: "
                                           f"name what to open, e.g. components=('llm',) for the LLM alone")
    for folder in folders:
        component = bound.get(folder.name)
        if component is None:
            continue
        if wanted is not None and component.NAME not in wanted:
            continue
        cfg = component.read(folder, llm)
        if cfg is not None:
            found[component.NAME] = cfg
    return found


def _holds_an_engine(folder: Path) -> bool:
    """Whether ``folder`` holds what makes an engine of an Edge-LLM directory: a config or an engine file."""
    return (folder / "config.json").is_file() or any(folder.glob("*.engine"))


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


def _check_pair(root: Path, base: LLMEngineConfig, draft: LLMEngineConfig) -> LLMEngineConfig:
    """The base and the draft must be one deployment; name the numbers that disagree. Returns the base config, with
    a DFlash draft's ``dflash_config.target_layer_ids`` as its ``eagle_hidden_state_layers`` (the layers its
    ``hidden_states`` output concatenates: the base config does not name them)."""
    bfile, dfile = root / CONFIG_FILES["base"], root / CONFIG_FILES["draft"]
    for family in family_configs():  # each family's own checks of the pair, in the table's order
        found = base.feature(family) or draft.feature(family)
        if found is not None:
            base = found.check_pair(base, draft, (bfile, dfile))
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
    return base


# -- tensor-parallel directories ----------------------------------------------------------------


def _tp_config_file(root: Path) -> Path:
    found = sorted(p for p in root.iterdir() if TP_CONFIG_PATTERN.fullmatch(p.name) and p.is_file())
    if len(found) > 1:
        raise ConfigError(str(root), f"holds {', '.join(p.name for p in found)}: one tensor-parallel build per "
                                     "directory (Edge-LLM's rank 0 writes one config_world{N}.json)")
    return found[0]


def _read_ranks(file: Path, data: Any) -> tuple[LLMEngineConfig, _Ranks]:
    """The whole model's config and each rank's, from a ``config_world{N}.json``: ``rank_configs`` must list
    ranks 0 .. N - 1 once each, with an engine file name and overrides of existing sharded keys only, which
    split the heads, KV heads and MLP width evenly (KV heads may also be replicated: one per rank)."""
    match = TP_CONFIG_PATTERN.fullmatch(file.name)
    assert match is not None
    world = int(match.group(1))
    where = str(file)
    if not isinstance(data, Mapping):
        raise ConfigError(where, f"must hold a JSON object (Edge-LLM's engine config), got {type(data).__name__}")
    role, spec = data.get("engine_role"), data.get("spec_decode_type")
    if role in ("base", "draft") or (spec is not None and spec != "none"):
        key, value = ("engine_role", role) if role in ("base", "draft") else ("spec_decode_type", spec)
        raise ConfigError(f"{where}: {key}", f"is {value!r}: tensor-parallel speculative decoding is not supported "
                                             "(Edge-LLM 0.11 builds tensor-parallel engines for plain LLMs only)")
    if world < 1:
        raise ConfigError(where, "names 0 ranks (config_world0.json); expected config_world{N}.json with N >= 1")
    builder = data.get("builder_config")
    tp = builder.get("tp_size") if isinstance(builder, Mapping) else None
    if tp != world:
        raise ConfigError(f"{where}: builder_config.tp_size", f"is {tp!r}, but the file name says {world} ranks "
                                                              f"({file.name}); Edge-LLM writes config_world{{tp_size}}"
                                                              ".json")
    whole_data = {k: v for k, v in data.items() if k != "rank_configs"}
    whole = _mapped(whole_data, where)
    entries = _rank_entries(where, data.get("rank_configs"), world)
    engines, configs = [], []
    for i, entry in entries:
        overrides = _overrides(where, i, entry.get("config_overrides"), whole_data)
        rank_data = copy.deepcopy(whole_data)
        rank_data.setdefault("head_dim", whole.head_dim)  # the rank's heads must not change the head size
        rank_data.update(copy.deepcopy(overrides))
        rank = int(entry["rank"])
        cfg = _mapped(rank_data, f"{where} (rank {rank})")
        extras = {**cfg.extras, "tp_rank": rank, "tp_size": world}
        configs.append(dataclasses.replace(cfg, extras=extras))
        engines.append(str(entry["engine"]))
    _check_split(where, entries, whole, configs, whole_data, world)
    return whole, _Ranks(file, tuple(engines), tuple(configs))


def _mapped(data: Mapping[str, Any], where: str) -> LLMEngineConfig:
    mapped = map_edgellm_config(data, what=where, tensor_parallel=True)
    try:
        return LLMEngineConfig(**mapped.values).validate()
    except ConfigError as exc:
        raise mapped.error_for(exc) from None


def _rank_entries(where: str, raw: Any, world: int) -> list[tuple[int, Mapping[str, Any]]]:
    """``rank_configs`` as (index, entry) in rank order, checked."""
    if not isinstance(raw, list):
        raise ConfigError(f"{where}: rank_configs", f"is {'absent' if raw is None else type(raw).__name__}; a "
                                                    f"tensor-parallel config lists each rank's engine and overrides")
    if len(raw) != world:
        raise ConfigError(f"{where}: rank_configs", f"has {len(raw)} entries, but tp_size is {world} (Edge-LLM's "
                                                    "runtime: rank_configs length must match tpSize)")
    by_rank: dict[int, tuple[int, Mapping[str, Any]]] = {}
    names: dict[str, int] = {}
    for i, entry in enumerate(raw):
        key = f"{where}: rank_configs[{i}]"
        if not isinstance(entry, Mapping):
            raise ConfigError(key, f"expected an object, got {type(entry).__name__}")
        rank = entry.get("rank")
        if not is_int(rank) or not 0 <= rank < world:
            raise ConfigError(f"{key}.rank", f"expected a rank in 0..{world - 1}, got {rank!r}")
        if int(rank) in by_rank:
            raise ConfigError(f"{key}.rank", f"rank {rank} is listed twice (also rank_configs"
                                             f"[{by_rank[int(rank)][0]}])")
        engine = entry.get("engine")
        if (not isinstance(engine, str) or not engine or Path(engine).name != engine or engine in (".", "..")
                or "\0" in engine):
            raise ConfigError(f"{key}.engine", f"expected the rank's engine file name (beside the config), got "
                                               f"{engine!r}")
        if engine in names:
            raise ConfigError(f"{key}.engine", f"{engine!r} is also rank {names[engine]}'s engine")
        names[engine] = int(rank)
        by_rank[int(rank)] = (i, entry)
    missing = [r for r in range(world) if r not in by_rank]
    if missing:
        raise ConfigError(f"{where}: rank_configs", f"has no entry for rank {missing[0]}")
    return [by_rank[r] for r in range(world)]


def _overrides(where: str, i: int, raw: Any, whole: Mapping[str, Any]) -> Mapping[str, Any]:
    key = f"{where}: rank_configs[{i}].config_overrides"
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ConfigError(key, f"expected an object, got {type(raw).__name__}")
    for name in raw:
        if name not in whole:
            raise ConfigError(f"{key}.{name}", f"overrides a key {Path(where).name} does not have (the overrides "
                                               f"change the whole model's {', '.join(SHARDED_KEYS[:3])}, ...)")
        if name not in SHARDED_KEYS:
            raise ConfigError(f"{key}.{name}", f"is not a dimension Edge-LLM shards across ranks (it overrides "
                                               f"{', '.join(SHARDED_KEYS)} only)")
    return raw


def _check_split(where: str, entries: list[tuple[int, Mapping[str, Any]]], whole: LLMEngineConfig,
                 ranks: list[LLMEngineConfig], whole_data: Mapping[str, Any], world: int) -> None:
    """Each rank holds 1/N of the attention heads and of the MLP, and 1/N of the KV heads (or, where there
    are fewer KV heads than ranks, one of them, each KV head on N / kv_heads ranks)."""
    heads, kv = whole.num_attention_heads, whole.num_kv_heads
    mlp = whole_data.get("intermediate_size")
    for (i, _), cfg in zip(entries, ranks):
        key = f"{where}: rank_configs[{i}].config_overrides"
        if heads % world or cfg.num_attention_heads != heads // world:
            raise ConfigError(f"{key}.num_attention_heads",
                              f"rank {cfg.extras['tp_rank']} has {cfg.num_attention_heads} attention heads; "
                              f"{world} ranks split the model's {heads} evenly ({_share(heads, world)} each)")
        if kv % world == 0:
            want = kv // world
        elif world % kv == 0:
            want = 1  # KV heads replicated: rank r reads KV head r * kv // world
        else:
            want = -1
        if cfg.num_kv_heads != want:
            split = f"{want} each" if want > 0 else "neither evenly nor one per rank"
            raise ConfigError(f"{key}.num_key_value_heads",
                              f"rank {cfg.extras['tp_rank']} has {cfg.num_kv_heads} KV heads; {world} ranks split "
                              f"the model's {kv}: {split}")
        rank_mlp = cfg.extras.get("intermediate_size")
        if is_int(mlp) and (not is_int(rank_mlp) or mlp % world or rank_mlp != mlp // world):
            raise ConfigError(f"{key}.intermediate_size",
                              f"rank {cfg.extras['tp_rank']} has intermediate_size {rank_mlp!r}; {world} ranks split "
                              f"the model's {mlp} evenly ({_share(mlp, world)} each)")


def _share(total: int | np.integer[Any], world: int) -> str:
    """``total / world`` as text, exact for any ints (a float would overflow for a huge JSON int)."""
    whole, rest = divmod(int(total), world)
    return str(whole) if not rest else f"{total}/{world}, not a whole number"
