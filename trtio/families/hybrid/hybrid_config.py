"""A hybrid model's typed config: the recurrent layers' state (Qwen3.5's Gated DeltaNet, Nemotron-H's Mamba2).

The dense core lists the layer stack (``LLMEngineConfig.layer_types``: ``"attention"`` or ``"mamba"``, any recurrent
layer); :class:`HybridConfig` holds what the recurrent layers need beside it, read from Edge-LLM's keys:

======================================== ============================== ====================================
Edge-LLM key                             keyword                        note
======================================== ============================== ====================================
``layer_types``, ``kv_layer_configs``    same names (the core's)        entries 'attention' / 'mamba'; KV
                                                                        geometry per attention layer
``conv_dim``, ``conv_kernel``,           same names                     required where a layer is 'mamba';
``recurrent_state_*``                                                   dtypes fp16 / bf16 / fp32
``recurrent_spec_verify_mode``           same name, ``recurrent_kind``  'snapshot' (GDN) / 'replay' (Mamba2);
                                                                        the kind also from groups and dtype
======================================== ============================== ====================================
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from trtio import names
from trtio._config import LLMEngineConfig, check_non_negative, check_positive, dtype_name, python_ints
from trtio._dtypes import DType
from trtio._edgellm_config import EdgeReader, got
from trtio._engine import EngineIO
from trtio._registry import ProfileShapes, TensorRegistry, TensorSpec
from trtio.errors import ConfigError
from trtio.features import FamilyConfig

__all__ = ["RECURRENT_KINDS", "SPEC_VERIFY_MODES", "HybridConfig", "intermediate_state_specs", "is_recurrent_state",
           "recurrent_problems", "recurrent_state_names", "recurrent_state_specs"]

#: ``HybridConfig.recurrent_kind``: the recurrence of a hybrid model's recurrent layers.
RECURRENT_KINDS = ("gated_deltanet", "mamba2")
#: ``recurrent_spec_verify_mode``: how a speculative verify commits recurrent state (Edge-LLM's GDN "snapshot",
#: Mamba2 "replay").
SPEC_VERIFY_MODES = ("snapshot", "replay")
_STATE_DTYPES = ("float16", "bfloat16", "float32")
_EDGELLM_STATE_DTYPES = ("fp16", "bf16", "fp32")
_LAYER_TYPES = ("attention", "mamba")
_GEOMETRY = ("conv_dim", "conv_kernel", "recurrent_state_num_heads", "recurrent_state_head_dim",
             "recurrent_state_size")


@dataclass(frozen=True)
class HybridConfig(FamilyConfig):
    """The recurrent layers of a hybrid model: their kind, conv and recurrent state geometry and dtypes, and how a
    speculative verify commits their state. ``layers``: the recurrent layers' indices in the core's ``layer_types``
    (recurrent layer j is the j-th)."""

    recurrent_kind: str | None = None  # "gated_deltanet" | "mamba2"
    conv_dim: int = 0  # channels of a recurrent layer's causal conv state [rows, conv_dim, conv_kernel]
    conv_kernel: int = 0
    recurrent_state_num_heads: int = 0  # recurrent state [rows, heads, head_dim, size] (GDN: v heads, k dim, v dim)
    recurrent_state_head_dim: int = 0
    recurrent_state_size: int = 0
    recurrent_state_num_groups: int = 0  # Mamba2's B/C groups (0: not given)
    recurrent_state_dtype: str = "float32"
    conv_state_dtype: str = "float16"
    recurrent_spec_verify_mode: str | None = None  # "snapshot" (GDN) | "replay" (Mamba2)
    layers: tuple[int, ...] = ()

    KEYWORDS = {"recurrent_kind": None, "conv_dim": 0, "conv_kernel": 0, "recurrent_state_num_heads": 0,
                "recurrent_state_head_dim": 0, "recurrent_state_size": 0, "recurrent_state_num_groups": 0,
                "recurrent_state_dtype": "float32", "conv_state_dtype": "float16", "recurrent_spec_verify_mode": None}
    SOURCE_KEYS = {"recurrent_kind": "recurrent_spec_verify_mode", **{k: k for k in KEYWORDS
                                                                     if k != "recurrent_kind"}}
    ALIASES = {
        "is_hybrid": lambda cfg, h: h is not None,
        "recurrent_layers": lambda cfg, h: h.layers if h is not None else (),
        "num_recurrent_layers": lambda cfg, h: len(h.layers) if h is not None else 0,
        "conv_state_shape": lambda cfg, h: (h or HybridConfig()).conv_state_shape,
        "recurrent_state_shape": lambda cfg, h: (h or HybridConfig()).recurrent_state_shape,
    }

    def __post_init__(self) -> None:
        python_ints(self)
        object.__setattr__(self, "recurrent_state_dtype", dtype_name(self.recurrent_state_dtype))
        object.__setattr__(self, "conv_state_dtype", dtype_name(self.conv_state_dtype))

    @classmethod
    def from_keywords(cls, given: Mapping[str, Any], core: Mapping[str, Any]) -> HybridConfig | None:
        types = core["layer_types"]
        layers = tuple(i for i, t in enumerate(types) if t != "attention")
        if not layers and all(given[k] == v for k, v in cls.KEYWORDS.items()):
            return None
        return cls(**given, layers=layers)

    def keywords(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name in self.KEYWORDS}

    @property
    def num_layers(self) -> int:
        """The recurrent layers."""
        return len(self.layers)

    @property
    def conv_state_shape(self) -> tuple[int, int]:
        """One slot's conv state: ``[conv_dim, conv_kernel]``."""
        return (self.conv_dim, self.conv_kernel)

    @property
    def gdn_key_heads(self) -> int | None:
        """A Gated DeltaNet layer's key (and query) heads, from the conv's channels as Edge-LLM's runtime derives them
        (``mambaCacheManager.cpp::replayCommitAcceptedTreeStates``: the conv runs over q, k and v together, ``conv_dim
        = 2 x heads x head_dim + value heads x size``; value head ``j`` reads key head ``j // (value heads / heads)``);
        None where ``conv_dim`` gives no such count (or the layers are not Gated DeltaNet)."""
        hv, dk, dv = self.recurrent_state_shape
        rest = self.conv_dim - hv * dv
        if self.recurrent_kind != "gated_deltanet" or dk <= 0 or rest <= 0 or rest % (2 * dk):
            return None
        heads = rest // (2 * dk)
        return heads if hv % heads == 0 else None

    @property
    def recurrent_state_shape(self) -> tuple[int, int, int]:
        """One slot's recurrent state: ``[heads, head_dim, size]`` (GDN: value heads, key dim, value dim; Mamba2:
        heads, head dim, SSM state)."""
        return (self.recurrent_state_num_heads, self.recurrent_state_head_dim, self.recurrent_state_size)

    def validate(self, cfg: LLMEngineConfig) -> None:
        """The recurrent geometry and dtypes, all or none: set where ``layer_types`` has a recurrent layer, unset
        otherwise."""
        if not self.layers:
            set_ = [n for n in (*_GEOMETRY, "recurrent_state_num_groups") if getattr(self, n)]
            if self.recurrent_kind is not None or set_ or self.recurrent_spec_verify_mode is not None:
                name = set_[0] if set_ else ("recurrent_kind" if self.recurrent_kind is not None
                                             else "recurrent_spec_verify_mode")
                raise ConfigError(name, "is set but layer_types has no recurrent ('mamba') layer")
            return
        check_positive(self, *_GEOMETRY)
        check_non_negative(self, "recurrent_state_num_groups")
        if self.recurrent_kind not in RECURRENT_KINDS:
            raise ConfigError("recurrent_kind", f"must be one of {list(RECURRENT_KINDS)} on a hybrid model, got "
                                                f"{self.recurrent_kind!r}")
        for name in ("recurrent_state_dtype", "conv_state_dtype"):
            if getattr(self, name) not in _STATE_DTYPES:
                raise ConfigError(name, f"must be one of {_STATE_DTYPES}, got {getattr(self, name)!r}")
        mode = self.recurrent_spec_verify_mode
        if mode is not None and mode not in SPEC_VERIFY_MODES:
            raise ConfigError("recurrent_spec_verify_mode", f"must be one of {list(SPEC_VERIFY_MODES)} or null, got "
                                                            f"{mode!r}")

    def registry(self, reg: TensorRegistry, cfg: LLMEngineConfig) -> TensorRegistry:
        """A hybrid engine reads ``state_indices`` (each step sequence's state row); a hybrid spec-decode base of the
        ragged contract also writes each verified token's states (``intermediate_*``)."""
        if names.kStateIndices in reg:
            reg.replace(dataclasses.replace(reg[names.kStateIndices], optional=not self.layers))
        if reg.contract == "ragged" and cfg.role == "base":
            for spec in intermediate_state_specs(cfg):
                reg.add(spec)
        return reg

    @classmethod
    def input_problems(cls, eio: EngineIO, cfg: LLMEngineConfig, bound: set[str]) -> tuple[set[str], list[str]]:
        """An engine declaring recurrent state its config has no recurrent layer for (a config with them checks its
        pools in :meth:`engine_problems`)."""
        if cfg.feature(HybridConfig) is not None:
            return set(), []
        return set(), recurrent_problems(eio, cfg, 0)

    def check_runs(self, base: LLMEngineConfig, draft: LLMEngineConfig, what: str) -> None:
        """A hybrid base whose accept trtio cannot commit (:mod:`trtio.families.hybrid.snapshots`) is refused: Mamba2's
        "replay" verify mode, a Mamba2 base built as a DDTree base, a Gated DeltaNet DDTree base whose replay stash
        trtio cannot lay out (:mod:`trtio.families.hybrid.replay`)."""
        if not self.layers:
            return
        if self.recurrent_spec_verify_mode == "replay":
            raise ConfigError("recurrent_spec_verify_mode", f"{what}: 'replay' (Mamba2: the accepted token's state "
                                                            "is recomputed from a dA/u/B/dt stash) is not supported; "
                                                            "the pair is refused rather than committed wrong")
        key = next((k for k in ("mtp_tree_base", "dflash_tree_base", "jetspec_tree_base") if getattr(base, k)), None)
        if key is not None and self.recurrent_kind != "gated_deltanet":
            raise ConfigError(key, f"{what}: a {self.recurrent_kind} base built as a DDTree base (its recurrent "
                                   "plugins verify trees statelessly and leave a replay stash, Mamba2's dA/u/B/dt) is "
                                   "not supported: trtio replays Gated DeltaNet's stash only; the pair is refused "
                                   "rather than committed wrong")
        if key is not None and (self.gdn_key_heads is None or self.recurrent_state_dtype != "float32"):
            field = "recurrent_state_dtype" if self.gdn_key_heads is not None else "conv_dim"
            raise ConfigError(field, f"{what}: a Gated DeltaNet base built as a DDTree base ({key}) is committed by "
                                     "replaying its stash, which needs FP32 states and key heads from conv_dim = 2 x "
                                     "key heads x recurrent_state_head_dim + recurrent_state_num_heads x "
                                     f"recurrent_state_size (Edge-LLM's replayCommitAcceptedTreeStates); got "
                                     f"{field} {getattr(self, field)!r}")

    def engine_problems(self, eio: EngineIO, cfg: LLMEngineConfig, max_batch: int) -> list[str]:
        return recurrent_problems(eio, cfg, max_batch)

    @classmethod
    def read_edgellm(cls, r: EdgeReader, role: str, layers: int) -> dict[str, Any]:
        """The hybrid keys: ``layer_types``, ``kv_layer_configs``, the recurrent state's geometry and dtypes and
        ``recurrent_spec_verify_mode``; ``recurrent_kind`` told from them. Nothing for a dense config."""
        out: dict[str, Any] = {}
        types = r.take("layer_types", "a list of 'attention' / 'mamba'", required=False)
        n_linear = r.int_("num_linear_attn_layers", default=0, low=0, meaning="the recurrent layers")
        if types is None:
            if n_linear:
                raise r.error("num_linear_attn_layers", f"is {n_linear} but the config has no layer_types saying which "
                                                        "layers are recurrent")
            if r.has("recurrent_state_num_heads"):
                raise r.error("recurrent_state_num_heads", "describes recurrent state but the config has no "
                                                           "layer_types saying which layers are recurrent")
            return out
        if not isinstance(types, list) or any(t not in _LAYER_TYPES for t in types):
            bad = types if not isinstance(types, list) else next(t for t in types if t not in _LAYER_TYPES)
            raise r.error("layer_types", f"expected a list of {list(_LAYER_TYPES)} (Edge-LLM's per-layer routing: "
                                         f"any recurrent layer is 'mamba'), got {got(bad)}")
        table = r.take("kv_layer_configs", "a list with one entry per layer of layer_types", required=False)
        if table is not None:
            if not isinstance(table, list):
                raise r.error("kv_layer_configs", f"expected a list (one entry per layer), got {got(table)}")
            out["kv_layer_configs"] = [copy.deepcopy(e) for e in table]
        if types.count("attention") != layers:
            key = "num_attention_layers" if r.has("num_attention_layers") else "num_hidden_layers"
            raise r.error(key, f"is {layers} but layer_types lists {types.count('attention')} attention layers")
        out["layer_types"] = list(types)
        recurrent = types.count("mamba")
        if not recurrent:
            return out
        if r.has("num_linear_attn_layers") and n_linear != recurrent:
            raise r.error("num_linear_attn_layers", f"is {n_linear} but layer_types lists {recurrent} recurrent "
                                                    "layers")
        if role == "draft":
            raise r.error("engine_role", "is 'draft' on a hybrid model: trtio runs drafts of attention layers only (an "
                                         "MTP or EAGLE3 draft); the config is refused rather than bound wrong")
        for key in _GEOMETRY:
            out[key] = r.int_(key, meaning="the recurrent layers' state geometry")
        groups = r.int_("recurrent_state_num_groups", default=0, low=0, meaning="Mamba2's B/C groups")
        out["recurrent_state_num_groups"] = groups
        state_dtype = r.str_("recurrent_state_dtype", _EDGELLM_STATE_DTYPES, meaning="the recurrent state's dtype")
        out["recurrent_state_dtype"] = str(DType.coerce(state_dtype))
        out["conv_state_dtype"] = str(DType.coerce(r.str_("conv_state_dtype", _EDGELLM_STATE_DTYPES,
                                                          meaning="the conv state's dtype")))
        mode = r.str_("recurrent_spec_verify_mode", SPEC_VERIFY_MODES, required=False, default="",
                      meaning="GDN 'snapshot', Mamba2 'replay'") or None
        out["recurrent_spec_verify_mode"] = mode
        out["recurrent_kind"] = _recurrent_kind(r, mode, state_dtype, groups)
        if out["recurrent_kind"] == "mamba2" and groups:
            # Mamba2's conv runs over x, B and C together: heads x head_dim + 2 x groups x state channels.
            want = out["recurrent_state_num_heads"] * out["recurrent_state_head_dim"] + 2 * groups * \
                out["recurrent_state_size"]
            if out["conv_dim"] != want:
                raise r.error("conv_dim", f"is {out['conv_dim']} but a Mamba2 layer of "
                                          f"{out['recurrent_state_num_heads']} heads x "
                                          f"{out['recurrent_state_head_dim']} + 2 x {groups} groups x "
                                          f"{out['recurrent_state_size']} state convolves {want} channels")
        return out


def _recurrent_kind(r: EdgeReader, mode: str | None, state_dtype: str, groups: int) -> str:
    """Gated DeltaNet or Mamba2, told from the keys Edge-LLM's writer sets differently for them: the verify mode
    (GDN "snapshot", Mamba2 "replay"), the B/C groups (Mamba2 only) and the recurrent state's dtype (GDN FP32, Mamba2
    FP16: the plugins' schemas). Keys that disagree are refused, naming the one that contradicts the first."""
    votes: list[tuple[str, str]] = []
    if mode is not None:
        votes.append(("recurrent_spec_verify_mode", "gated_deltanet" if mode == "snapshot" else "mamba2"))
    if groups:
        votes.append(("recurrent_state_num_groups", "mamba2"))
    votes.append(("recurrent_state_dtype", "gated_deltanet" if state_dtype == "fp32" else "mamba2"))
    key, kind = votes[0]
    for other, says in votes[1:]:
        if says != kind:
            raise r.error(other, f"marks a {says} layer but {key} marks {kind}: the recurrent kind is ambiguous")
    return kind


# -- what a hybrid engine declares --------------------------------------------------------------------------------
# Each recurrent layer j has two pools the engine updates in place, both with one row per resident sequence slot
# (max_batch_size rows, Edge-LLM's fixed resident-slot pool): conv_state_j [rows, conv_dim, conv_kernel] and
# recurrent_state_j [rows, heads, head_dim, size] (GDN FP32: value heads, key dim, value dim; Mamba2 FP16: heads, head
# dim, SSM state), aliased by present_conv_state_j and present_recurrent_state_j. A step's state_indices[s] is the
# slot of its sequence s: the engine reads and writes that row only. The engine state allocates and binds the pools
# whole, whatever the step's batch; a hybrid spec-decode base also writes each verified token's states
# (intermediate_*, trtio.families.hybrid.snapshots).

_NONE = HybridConfig()


def _hybrid(cfg: LLMEngineConfig) -> HybridConfig:
    """``cfg``'s recurrent layers (none: an empty HybridConfig)."""
    return cfg.feature(HybridConfig) or _NONE


def recurrent_state_names(cfg: LLMEngineConfig) -> list[tuple[str, str]]:
    """The (input, output) pairs of ``cfg``'s recurrent layers, in the exporter's order: every conv state, then
    every recurrent state."""
    n = _hybrid(cfg).num_layers
    return ([(names.conv_state(j), names.present_conv_state(j)) for j in range(n)]
            + [(names.recurrent_state(j), names.present_recurrent_state(j)) for j in range(n)])


def _geometry(cfg: LLMEngineConfig, name: str) -> tuple[DType, tuple[int, ...]]:
    """One slot's row of the pool ``name`` (its dtype and shape without the row dim)."""
    h = _hybrid(cfg)
    if name.startswith(names.kConvStateTemplate):
        return DType.coerce(h.conv_state_dtype), h.conv_state_shape
    return DType.coerce(h.recurrent_state_dtype), h.recurrent_state_shape


def recurrent_state_specs(cfg: LLMEngineConfig, max_batch: int | None = None) -> list[TensorSpec]:
    """What a hybrid engine of the ragged contract declares for its recurrent state: ``conv_state_j`` and
    ``recurrent_state_j`` inputs (rows dynamic in the graph, ``state_pool_rows``; the builder pins both profiles to
    ``max_batch_size`` rows), then their ``present_*`` outputs. Empty for a model without recurrent layers. The
    ReferenceEngine declares these; tests compare them with files the real exporter wrote."""
    rows = max_batch or cfg.max_supported_batch_size
    pairs = recurrent_state_names(cfg)
    inputs, outputs = [], []
    for past, present in pairs:
        dtype, row = _geometry(cfg, past)
        shape = (rows, *row)
        fixed: tuple[ProfileShapes, ...] = ((shape, shape, shape),) * 2
        declared = (-1, *row)
        inputs.append(TensorSpec(past, "input", dtype, shape, fixed, declared=declared))
        outputs.append(TensorSpec(present, "output", dtype, shape, declared=declared))
    return inputs + outputs


def intermediate_state_specs(cfg: LLMEngineConfig) -> list[TensorSpec]:
    """A hybrid spec-decode base's per-token states (``intermediate_conv_state_j`` then
    ``intermediate_recurrent_state_j``, ``[physical tokens, ...]``: each verified token's state, which accept commits
    into its sequence's slot in "snapshot" mode). Empty for any other engine."""
    n = _hybrid(cfg).num_layers
    if cfg.role != "base" or not n:
        return []
    out = []
    for template, pools in ((names.kIntermediateConvStateTemplate, names.kConvStateTemplate),
                            (names.kIntermediateRecurrentStateTemplate, names.kRecurrentStateTemplate)):
        dtype, row = _geometry(cfg, pools)
        for j in range(n):
            out.append(TensorSpec(f"{template}_{j}", "output", dtype, (("batch", "seq_len"), *row),
                                  declared=(-1, *row)))
    return out


def _recurrent_layer(name: str) -> int | None:
    for template in (names.kConvStateTemplate, names.kRecurrentStateTemplate):
        head = template + "_"
        if name.startswith(head) and name[len(head):].isdigit():
            return int(name[len(head):])
    return None


def is_recurrent_state(name: str) -> bool:
    """Whether ``name`` is a recurrent layer's state input (``conv_state_j`` / ``recurrent_state_j``): a pool of one
    row per slot, bound whole whatever the step's batch."""
    return _recurrent_layer(name) is not None


def _fmt(shape: Sequence[int]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def recurrent_problems(eio: EngineIO, cfg: LLMEngineConfig, max_batch: int) -> list[str]:
    """Every disagreement between the recurrent state an engine declares and its config: a pool missing or beyond
    the config's recurrent layers, its dtype, its per-slot dims, and a pool with fewer rows than the setup's
    ``max_batch`` slots (``state_indices`` index it by slot)."""
    problems = []
    want = dict(recurrent_state_names(cfg))
    declared = [info.name for info in eio.inputs if _recurrent_layer(info.name) is not None]
    for name in declared:
        if name not in want:
            have = (f"{_hybrid(cfg).num_layers} recurrent layers" if _hybrid(cfg).num_layers
                    else "no recurrent layer (layer_types)")
            problems.append(f"{name}: the engine declares this recurrent state but the config has {have}")
    for past in want:
        if past not in eio:
            problems.append(f"{past}: the config has {_hybrid(cfg).num_layers} recurrent layers but the engine "
                            f"declares no {past}")
            continue
        info = eio[past]
        dtype, row = _geometry(cfg, past)
        field = "conv_state_dtype" if past.startswith(names.kConvStateTemplate) else "recurrent_state_dtype"
        if info.dtype is not dtype:
            problems.append(f"{past}: the engine's state is {info.dtype} but the config's {field} is {dtype}")
        shape, top = info.shape, info.max_shape()
        if len(shape) != 1 + len(row):
            problems.append(f"{past}: expected [rows, {', '.join(str(d) for d in row)}], the engine declares rank "
                            f"{len(shape)} {_fmt(shape)}")
            continue
        for dim, value in enumerate(row, start=1):
            got = shape[dim] if shape[dim] >= 0 else top[dim]
            if got != value:
                problems.append(f"{past}: dim {dim} is {got} in the engine but {value} in the config")
        if 0 <= top[0] < max_batch:
            problems.append(f"{past}: the engine's pool holds {top[0]} rows, fewer than the {max_batch} sequence "
                            f"slots state_indices address")
    return problems


