"""Gemma 4's engine config: per-layer KV geometry, sliding and full layers, KV sharing, dual RoPE and PLE.

Edge-LLM 0.11 writes these keys beside the dense ones (``docs/edgellm-assumptions.md`` §10 lists what trtio
assumes where its contract is open):

=================================== =====================================================================
Edge-LLM key                        meaning, as read here
=================================== =====================================================================
``kv_layer_configs``                per attention layer ``{num_kv_heads, head_dim[, kv_cache_capacity]}``
``global_head_dim``                 the full (global) layers' head dim; the others are sliding
``attention_layer_types``           where written: ``sliding_attention`` / ``full_attention`` per layer
``sliding_window_size``,            the window ``W`` of the sliding layers; a sliding layer's
``kv_layer_configs[i].kv_cache_     ``kv_cache_capacity`` below the model's capacity is ``W`` too; 0 where
capacity``                          nothing writes it (then only the full SWA mode can be bound)
``builder_config.num_swa_pages``    where written: the bounded SWA pool's pages
``kv_sharing_donors``               per layer -1, or the earlier layer whose KV cache it reads
``sliding_rope_config``,            each table's ``rope_theta``, ``rope_scaling`` (``default``,
``full_rope_config``                ``proportional`` or an HF type) and ``partial_rotary_factor``
``ple_enabled``, ``num_ple_inputs``,one ``ple_token_embeds_i [T, ple_hidden_size]`` input per layer
``ple_hidden_size``
=================================== =====================================================================

A key that changes what trtio binds or computes and cannot be honoured is refused (:class:`ConfigError` naming
the file and the key), never ignored.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from trtio import names
from trtio._checks import is_int
from trtio._config import LLMEngineConfig
from trtio._dtypes import DType
from trtio._edgellm_config import EdgeReader, got
from trtio._engine import EngineIO
from trtio._json import json_kind
from trtio._memory import TensorRequest
from trtio._registry import ProfileShapes, TensorRegistry, TensorSpec
from trtio._rope import (
    RopeScaling,
    no_rope_cos_sin_rows,
    proportional_rope_parameters,
    rope_cos_sin_rows,
    rope_parameters,
)
from trtio._safetensors import read_safetensors
from trtio._tensor_map import TensorMap
from trtio.edgellm import embedding_float16
from trtio.errors import ConfigError, InvalidValueError
from trtio.families.gemma4.swa import BoundedSwaPages, SwaMode
from trtio.features import FamilyConfig, Found, KVPools, StateBinding

__all__ = ["GEMMA4_FULL_ROWS", "GEMMA4_FULL_TABLE", "GEMMA4_MTP", "PLE_EMBEDDING_FILE", "SWA_REPLACEMENT_PAGES",
           "SWA_TABLE", "Gemma4Config", "LayerRope", "bound_swa_mode", "check_cached_prefix_step", "choose_swa_mode",
           "is_gemma4", "q_only_consumers", "read_gemma4", "swa_private_pages"]

GEMMA4_FULL_ROWS = "ragged_rope_cos_sin_full"  # a step's full-layer RoPE rows [T, full width]
GEMMA4_FULL_TABLE = "rope_table_full"  # the full layers' table [C, full width], filled at bind
SWA_TABLE = "swa_kv_page_table"  # the step block's bounded SWA rows (bound in the bounded mode)
GEMMA4_MTP = "gemma4_mtp"  # the spec_decode_type of a Gemma 4 target and its assistant (trtio.families.gemma4_mtp)
#: The per-layer embedding table (PLE), beside ``embedding.safetensors``.
PLE_EMBEDDING_FILE = "ple_embedding.safetensors"

#: Pages a bounded SWA sequence holds beyond its retained window (Edge-LLM's ``kSWA_REPLACEMENT_PAGES``
#: reading of ``2 * (ceil(W / page) + 1) + 1``: the window's pages twice, plus one being replaced).
SWA_REPLACEMENT_PAGES = 1
_KINDS = ("sliding", "full")
_HF_KINDS = {"sliding_attention": "sliding", "full_attention": "full"}


def swa_private_pages(window: int, page: int) -> int:
    """Pages each bounded SWA sequence reserves: ``2 * (ceil(W / page) + 1) + 1``."""
    return 2 * (math.ceil(window / page) + 1) + SWA_REPLACEMENT_PAGES


def is_gemma4(data: Mapping[str, Any]) -> bool:
    """True for a config Edge-LLM wrote for a Gemma 4 text model (``model`` ``gemma4*``)."""
    model = data.get("model", data.get("model_type"))
    return isinstance(model, str) and model.startswith("gemma4")


@dataclass(frozen=True)
class LayerRope:
    """One of Gemma 4's two RoPE configs: ``rope_type`` ``"default"``, ``"proportional"`` (transformers'
    Gemma 4 RoPE: a ``head_dim``-wide table whose last frequencies are 0) or another HF type (``scaling``)."""

    rope_type: str
    theta: float
    partial_rotary_factor: float
    head_dim: int
    factor: float = 1.0  # proportional: every frequency divided by it
    scaling: RopeScaling | None = None  # an HF type other than default / proportional

    @property
    def width(self) -> int:
        """Columns of the ``rope_rotary_cos_sin_*`` table: ``[cos | sin]`` halves."""
        if self.rope_type == "proportional":
            return self.head_dim
        return round(self.head_dim * self.partial_rotary_factor)

    def inv_freq(self) -> tuple[np.ndarray, float]:
        """``(inv_freq [width / 2], attention_factor)``."""
        if self.rope_type == "proportional":
            return proportional_rope_parameters(self.head_dim, self.theta, self.partial_rotary_factor,
                                                self.factor), 1.0
        return rope_parameters(self.width, self.theta, self.scaling)

    def rows(self, positions: np.ndarray) -> np.ndarray:
        """float32 ``[N, width]``: the table rows of ``positions`` [N]."""
        inv, attention = self.inv_freq()
        return rope_cos_sin_rows(positions, inv, attention)

    def to_dict(self) -> dict[str, Any]:
        return {"rope_type": self.rope_type, "theta": self.theta, "partial_rotary_factor": self.partial_rotary_factor,
                "head_dim": self.head_dim, "factor": self.factor,
                "scaling": None if self.scaling is None else self.scaling.to_dict()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LayerRope:
        scaling = data.get("scaling")
        return cls(data["rope_type"], float(data["theta"]), float(data["partial_rotary_factor"]),
                   int(data["head_dim"]), float(data.get("factor", 1.0)),
                   RopeScaling.from_hf(scaling) if scaling is not None else None)


@dataclass(frozen=True)
class Gemma4Config(FamilyConfig):
    """Gemma 4's per-layer facts, indexed by attention layer (``past_key_values_i``)."""

    kinds: tuple[str, ...]  # "sliding" | "full"
    kv_heads: tuple[int, ...]
    head_dims: tuple[int, ...]
    donors: tuple[int, ...]  # -1: the layer owns its KV pool; else the layer whose pool it reads
    sliding_window: int  # W tokens; 0: the config does not say
    num_swa_pages: int  # the bounded pool's pages where the config writes them; 0 otherwise
    sliding_rope: LayerRope
    full_rope: LayerRope
    ple_hidden: int = 0  # 0: no per-layer embeddings
    ple_layers: int = 0

    @property
    def num_layers(self) -> int:
        return len(self.kinds)

    def is_sliding(self, layer: int) -> bool:
        return self.kinds[layer] == "sliding"

    def owner(self, layer: int) -> int:
        """The layer whose KV pool ``layer`` reads and writes: itself, or its donor."""
        donor = self.donors[layer]
        return layer if donor < 0 else donor

    @property
    def owners(self) -> tuple[int, ...]:
        """The layers that own a KV pool (not KV-sharing consumers)."""
        return tuple(i for i, d in enumerate(self.donors) if d < 0)

    def rope_for(self, layer: int) -> LayerRope:
        return self.sliding_rope if self.is_sliding(layer) else self.full_rope

    @property
    def has_ple(self) -> bool:
        return self.ple_hidden > 0

    def private_pages(self, page: int) -> int:
        """Pages each bounded SWA sequence reserves (0 where the window is unknown)."""
        return swa_private_pages(self.sliding_window, page) if self.sliding_window else 0

    def to_dict(self) -> dict[str, Any]:
        return {"kinds": list(self.kinds), "kv_heads": list(self.kv_heads), "head_dims": list(self.head_dims),
                "donors": list(self.donors), "sliding_window": self.sliding_window,
                "num_swa_pages": self.num_swa_pages, "sliding_rope": self.sliding_rope.to_dict(),
                "full_rope": self.full_rope.to_dict(), "ple_hidden": self.ple_hidden, "ple_layers": self.ple_layers}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Gemma4Config:
        return cls(tuple(data["kinds"]), tuple(data["kv_heads"]), tuple(data["head_dims"]), tuple(data["donors"]),
                   int(data["sliding_window"]), int(data["num_swa_pages"]), LayerRope.from_dict(data["sliding_rope"]),
                   LayerRope.from_dict(data["full_rope"]), int(data.get("ple_hidden", 0)),
                   int(data.get("ple_layers", 0)))

    # -- the family (trtio.features.FamilyConfig): the keyword it owns, its checks and its declarations ----------
    KEYWORDS = {"gemma4": None}
    SOURCE_KEYS = {"gemma4": "kv_layer_configs"}
    STATE_BINDINGS = (names.kSwaKVPageTable, names.kSwaKVCacheMode)

    @classmethod
    def from_keywords(cls, given: Mapping[str, Any], core: Mapping[str, Any]) -> Gemma4Config | None:
        value = given["gemma4"]
        if isinstance(value, Mapping):
            return cls.from_dict(value)
        if value is not None and not isinstance(value, Gemma4Config):
            raise ConfigError("gemma4", f"must be a Gemma 4 config (an object) or null, got {type(value).__name__}")
        return value

    def keywords(self) -> dict[str, Any]:
        return {"gemma4": self}

    def to_json(self) -> dict[str, Any]:
        return {"gemma4": self.to_dict()}

    @property
    def gemma4(self) -> Gemma4Config:
        """Itself: ``cfg.gemma4``, the keyword's attribute on an LLMEngineConfig."""
        return self

    def validate(self, cfg: LLMEngineConfig) -> None:
        if self.num_layers != cfg.num_attention_layers:
            raise ConfigError("gemma4", f"describes {self.num_layers} layers but num_attention_layers is "
                                        f"{cfg.num_attention_layers}")

    def kv_geometry(self, layer: int) -> tuple[int, int] | None:
        """Each attention layer its own KV heads and head dim."""
        return (self.kv_heads[layer], self.head_dims[layer]) if layer < self.num_layers else None

    def sliding_pools(self) -> set[str]:
        """The sliding layers' pools (``past_key_values_i``)."""
        return {names.past_key_values(i) for i in range(self.num_layers) if self.is_sliding(i)}

    def own_sized_pools(self, cfg: LLMEngineConfig) -> set[str]:
        """A sliding pool's page count is chosen at binding (the full pool's, or the bounded SWA pool's)."""
        return self.sliding_pools()

    def kv_pools(self, eio: EngineIO, cfg: LLMEngineConfig, max_batch: int,
                 staged: Mapping[str, Any]) -> KVPools:
        """Each KV-sharing consumer's pool read through its donor's; where the engine has the SWA inputs, the
        sliding pools at the SWA mode's pages, ``swa_kv_page_table`` bound to the staged bounded rows (bounded mode)
        or to ``kv_page_table`` (full), the shape-only ``swa_kv_cache_mode`` (length 1 bounded, 0 full), and the
        bounded mode's page book for the feature (``parts``: ``swa_mode``, ``swa_pages``)."""
        pools = KVPools(shared={names.past_key_values(i): names.past_key_values(self.owner(i))
                                for i in range(self.num_layers) if self.owner(i) != i})
        if names.kSwaKVPageTable not in eio:
            return pools
        table = staged.get(SWA_TABLE)
        mode = bound_swa_mode(cfg, eio, max_batch, bounded_ok="" if table is not None else
                              "this setup stages no SWA table (pages on demand)")
        m = eio[names.kKVPageTable].max_shape()[2]
        pools.pages = dict.fromkeys(self.sliding_pools(), mode.pool_pages)
        pools.bindings = [
            StateBinding(TensorSpec(names.kSwaKVPageTable, "input", DType.INT32, ("batch", 2, m)),
                         table if mode.bounded else None),
            StateBinding(TensorSpec(names.kSwaKVCacheMode, "input", DType.INT8, (mode.mode_length,)), own=(1,),
                         view=(mode.mode_length,))]
        pages = BoundedSwaPages(mode.pool_pages, max_batch, window=self.sliding_window, page_size=cfg.kv_page_size,
                                pages_per_sequence=m, private_pages=mode.private_pages) if mode.bounded else None
        pools.parts = {"swa_mode": mode, "swa_pages": pages}
        return pools

    def engine_problems(self, eio: EngineIO, cfg: LLMEngineConfig, max_batch: int) -> list[str]:
        """A sliding pool's profile spans the full pool's pages and the bounded pool's (llmBuilder.cpp::
        setupKVCacheProfiles): full SWA storage binds it at the full pool's, which its range must take."""
        problems = []
        pairs = dict(eio.state_pairs())
        for past in sorted(self.sliding_pools() & set(pairs)):
            info = eio[past]
            lo, hi = (min(p[0][1] for p in info.profiles), max(p[2][1] for p in info.profiles)) \
                if info.profiles else (info.max_shape()[1],) * 2
            if not lo <= cfg.kv_pool_pages <= hi:
                problems.append(f"{past}: the engine's sliding pool takes {lo} .. {hi} pages, not the full pool's "
                                f"{cfg.kv_pool_pages} (kv_pool_pages): full SWA storage cannot be bound")
        return problems

    def declared_state(self, cfg: LLMEngineConfig, max_batch: int) -> list[TensorSpec]:
        """Each layer its own heads and head dim; sliding pools full-size or bounded; the sliding layers' page table
        and the shape-only mode (length 1 bounded, 0 full)."""
        b, m = max_batch, cfg.pages_per_sequence
        lo = min(self.num_swa_pages or b * self.private_pages(cfg.kv_page_size) or cfg.kv_pool_pages,
                 cfg.kv_pool_pages) if cfg.role == "llm" else cfg.kv_pool_pages  # spec mode: full storage only
        pools = []
        for i in range(self.num_layers):
            top = (2, cfg.kv_pool_pages, cfg.kv_page_size, self.kv_heads[i], self.head_dims[i])
            low = (2, lo, *top[2:]) if self.is_sliding(i) else top
            pools.append((top, ((low, top, top),) * 2, (2, -1, *top[2:])))
        out = [TensorSpec(names.past_key_values(i), "input", cfg.kv_dtype, shape, profiles, declared=decl)
               for i, (shape, profiles, decl) in enumerate(pools)]
        table: tuple[ProfileShapes, ...] = (((1, 2, m), (b, 2, m), (b, 2, m)),) * 2
        out.append(TensorSpec(names.kKVPageTable, "input", DType.INT32, ("batch", 2, m), table, declared=(-1, 2, -1)))
        if cfg.role == "llm":  # a spec pair's engines have no bounded SWA storage (Edge-LLM turns it off there)
            out.append(TensorSpec(names.kSwaKVPageTable, "input", DType.INT32, ("batch", 2, m), table,
                                  declared=(-1, 2, -1)))
            out.append(TensorSpec(names.kSwaKVCacheMode, "input", DType.INT8, (1,), (((0,), (1,), (1,)),) * 2,
                                  declared=(-1,)))
        out += [TensorSpec(names.present_key_values(i), "output", cfg.kv_dtype, shape, declared=decl)
                for i, (shape, _profiles, decl) in enumerate(pools)]
        return out

    def rope_rows(self, cfg: LLMEngineConfig, positions: np.ndarray) -> np.ndarray:
        """The shared table is the sliding layers' (the full layers' is gathered beside it: :meth:`rope_gathers`);
        the identity where the config says ``use_rope: false``."""
        rows = self.sliding_rope.rows(positions)
        return rows if cfg.use_rope else no_rope_cos_sin_rows(*rows.shape)

    def full_rope_rows(self, cfg: LLMEngineConfig) -> np.ndarray:
        """The full layers' table ``[capacity, full width]`` (``full_rope_config``: proportional or not)."""
        rows = self.full_rope.rows(np.arange(cfg.max_kv_cache_capacity))
        return rows if cfg.use_rope else no_rope_cos_sin_rows(*rows.shape)

    def rope_gathers(self, cfg: LLMEngineConfig) -> list[tuple[str, str, int]]:
        return [(GEMMA4_FULL_ROWS, GEMMA4_FULL_TABLE, self.full_rope.width * DType.FLOAT32.itemsize)]

    def token_table(self, cfg: LLMEngineConfig, path: Path) -> np.ndarray | None:
        """The per-layer embedding table: float16 ``[rows, L x ple_hidden]`` from ``ple_embedding.safetensors``
        (tensor ``"weight"``, already scaled by its writer), read-only; None without PLE. ConfigError naming the file
        where it is absent or not ``L x ple_hidden`` wide."""
        if not self.has_ple:
            return None
        file = path / PLE_EMBEDDING_FILE
        if not file.is_file():
            raise ConfigError(str(file), "no such file (Edge-LLM writes the per-layer embedding table of a Gemma 4 "
                                         "model with PLE here)")
        tensors = read_safetensors(file)
        if "weight" not in tensors:
            raise ConfigError(str(file), f"holds no tensor 'weight' (it holds {sorted(tensors)})")
        table = tensors["weight"]
        width = self.ple_layers * self.ple_hidden
        if table.array.ndim != 2 or table.array.shape[1] != width:
            raise ConfigError(f"{file}: weight", f"expected [vocab, {width}] ({self.ple_layers} layers x "
                                                 f"ple_hidden_size {self.ple_hidden}), got {table.dtype} "
                                                 f"{list(table.array.shape)}")
        return embedding_float16(file, table, None)

    # -- the ragged contract's bindings and members ---------------------------------------------------------------
    def registry(self, reg: TensorRegistry, cfg: LLMEngineConfig) -> TensorRegistry:
        """One RoPE table per layer kind, each its own width, where a dense engine has one; per-layer embeddings."""
        if reg.contract != "ragged" or names.kRopeCosSin not in reg:
            return reg
        embeds = reg[names.kInputsEmbeds]  # [T, hidden]: its rows and profiles, another width
        t = embeds.shape[0]

        def spec(name: str, dtype: DType, width: int) -> TensorSpec:
            profiles: tuple[ProfileShapes, ...] = tuple(
                ((lo[0], width), (opt[0], width), (hi[0], width)) for lo, opt, hi in embeds.profiles)
            return TensorSpec(name, "input", dtype, (t, width), profiles)

        own = [spec(names.ple_token_embeds(i), cfg.activation, self.ple_hidden) for i in range(self.ple_layers)]
        own += [spec(names.kRopeCosSinSliding, DType.FLOAT32, self.sliding_rope.width),
                spec(names.kRopeCosSinFull, DType.FLOAT32, self.full_rope.width)]
        reg.replace_with(names.kRopeCosSin, own)
        return reg

    def members(self, cfg: LLMEngineConfig, rows: int) -> list[TensorRequest]:
        """The full layers' RoPE rows and table, and the per-layer embeddings."""
        width = self.full_rope.width
        out = [TensorRequest.of(GEMMA4_FULL_ROWS, (rows, width), DType.FLOAT32),
               TensorRequest.of(GEMMA4_FULL_TABLE, (cfg.max_kv_cache_capacity, width), DType.FLOAT32)]
        out += [TensorRequest.of(names.ple_token_embeds(i), (rows, self.ple_hidden), cfg.activation)
                for i in range(self.ple_layers)]
        return out

    def step_requests(self, cfg: LLMEngineConfig, place: str, batch: int, rows: int) -> list[TensorRequest]:
        """The bounded SWA pool's rows (:class:`~trtio.families.gemma4.swa.BoundedSwaPages`), staged each step with
        the page tables."""
        if place != "pages":
            return []
        return [TensorRequest.of(SWA_TABLE, (batch, 2, cfg.pages_per_sequence), DType.INT32)]

    def bind_pipeline(self, io: Any, tm: TensorMap, cfg: LLMEngineConfig) -> None:
        """The sliding layers' rows where a dense engine's are, the full layers' beside them; per-layer embeddings."""
        if names.kRopeCosSin not in tm:  # the batch contract binds no token-major rows
            return
        rows = tm[names.kRopeCosSin]
        del tm[names.kRopeCosSin]
        tm.set(names.kRopeCosSinSliding, rows)
        tm.set(names.kRopeCosSinFull, io.member(GEMMA4_FULL_ROWS))
        for i in range(self.ple_layers):
            tm.set(names.ple_token_embeds(i), io.member(names.ple_token_embeds(i)))

    # -- Edge-LLM's config.json ------------------------------------------------------------------------------------
    @classmethod
    def read_edgellm(cls, r: EdgeReader, role: str, layers: int) -> dict[str, Any]:
        """A Gemma 4 config's keys (``model`` ``gemma4*``): its per-layer facts, the KV table they give, and the
        top-level RoPE keys (which copy the full layers' RoPE: the core's single-table fields then describe the
        sliding layers' table). Nothing for another config."""
        if not is_gemma4(r.data):
            return {}
        capacity = r.int_("builder_config.max_kv_cache_capacity", meaning="KV cache tokens per sequence")
        g = read_gemma4(r.data, r.where, capacity=capacity)
        r.used.update(k for k in GEMMA4_KEYS if r.has(k))
        if role != "llm" and r.raw("spec_decode_type") != GEMMA4_MTP:
            raise r.error("engine_role", f"is {role!r} on a Gemma 4 model of spec_decode_type "
                                         f"{r.raw('spec_decode_type')!r}: a Gemma 4 pair trtio binds is a "
                                         f"{GEMMA4_MTP!r} one (a target and its KV-less assistant); refused rather "
                                         "than bound wrong")
        rotary_dim, theta, scaling = _top_rope(r, g)
        return {"gemma4": g, "rotary_dim": rotary_dim, "rope_theta": theta, "rope_scaling": scaling,
                "kv_layer_configs": [{"num_kv_heads": h, "head_dim": d} for h, d in zip(g.kv_heads, g.head_dims)]}

    @classmethod
    def unsupported(cls, r: EdgeReader) -> list[Found]:
        """Outside a Gemma 4 config, the keys of what only Gemma 4's reading binds: per-layer KV head dims, KV
        sharing, sliding-window dual RoPE, per-layer embeddings."""
        if is_gemma4(r.data):
            return []
        return [*_per_layer_kv_dims(r), *_kv_sharing(r), *_dual_rope(r), *_per_layer_embeddings(r)]


def _got(v: Any) -> str:
    return f"{v!r} (a {json_kind(v)})"


def _err(where: str, key: str, message: str) -> ConfigError:
    return ConfigError(f"{where}: {key}", message)


def _int(data: Mapping[str, Any], key: str, where: str, *, low: int = 0) -> int:
    value = data.get(key)
    if value is None:
        return 0
    if not is_int(value) or value < low:
        raise _err(where, key, f"expected an int >= {low}, got {_got(value)}")
    return int(value)


def _rope(data: Mapping[str, Any], key: str, head_dim: int, where: str) -> LayerRope:
    cfg = data.get(key)
    if not isinstance(cfg, Mapping):
        raise _err(where, key, f"is required on a Gemma 4 config (the RoPE of its {key.split('_')[0]} layers), got "
                               f"{_got(cfg)}")
    theta = cfg.get("rope_theta")
    if not isinstance(theta, (int, float)) or isinstance(theta, bool) or not math.isfinite(theta) or theta <= 0:
        raise _err(where, f"{key}.rope_theta", f"expected a finite number > 0, got {_got(theta)}")
    factor = cfg.get("partial_rotary_factor", 1.0)
    if not isinstance(factor, (int, float)) or isinstance(factor, bool) or not 0 < factor <= 1:
        raise _err(where, f"{key}.partial_rotary_factor", f"expected a number in (0, 1], got {_got(factor)}")
    scaling_dict = cfg.get("rope_scaling")
    if scaling_dict is not None and not isinstance(scaling_dict, Mapping):
        raise _err(where, f"{key}.rope_scaling", f"expected null or an object, got {_got(scaling_dict)}")
    scaling_dict = dict(scaling_dict or {})
    rope_type = scaling_dict.get("rope_type", scaling_dict.get("type", "default"))
    for copy_key, top in (("rope_theta", theta), ("partial_rotary_factor", factor)):
        copy_ = scaling_dict.get(copy_key)
        if copy_ is not None and (not isinstance(copy_, (int, float)) or not math.isclose(copy_, top, rel_tol=1e-9)):
            raise _err(where, f"{key}.rope_scaling.{copy_key}", f"is {copy_!r} but {key}.{copy_key} is {top!r}: the "
                                                                "table would depend on which one is read")
    if rope_type == "proportional":
        unknown = sorted(set(scaling_dict) - {"rope_type", "type", "rope_theta", "partial_rotary_factor", "factor"})
        if unknown:
            raise _err(where, f"{key}.rope_scaling.{unknown[0]}", "is not read by rope_type 'proportional' (it "
                                                                  "would change the table); trtio refuses it")
        scale = scaling_dict.get("factor", 1.0)
        if not isinstance(scale, (int, float)) or isinstance(scale, bool) or scale <= 0:
            raise _err(where, f"{key}.rope_scaling.factor", f"expected a number > 0, got {_got(scale)}")
        return LayerRope("proportional", float(theta), float(factor), head_dim, float(scale))
    width = head_dim * factor
    if abs(width - round(width)) > 1e-6 or round(width) % 2 or round(width) <= 0:
        raise _err(where, f"{key}.partial_rotary_factor", f"head_dim {head_dim} x {factor:g} = {width:g} is not a "
                                                          "positive even int (the rotary dimension)")
    try:
        scaling = RopeScaling.from_hf(scaling_dict, what=f"{key}.rope_scaling") if scaling_dict else None
        rope = LayerRope(rope_type if scaling is not None else "default", float(theta), float(factor), head_dim,
                         scaling=scaling)
        rope.inv_freq()
    except ConfigError as exc:
        raise _err(where, exc.field, exc.message) from None
    return rope


def _kinds(data: Mapping[str, Any], heads: Sequence[int], dims: Sequence[int], where: str) -> tuple[str, ...]:
    n = len(dims)
    written = data.get("attention_layer_types")
    if written is not None:
        if not isinstance(written, list) or len(written) != n or any(t not in _HF_KINDS for t in written):
            raise _err(where, "attention_layer_types", f"expected {n} entries of {sorted(_HF_KINDS)}, got "
                                                       f"{_got(written)}")
        return tuple(_HF_KINDS[t] for t in written)
    head_dim, global_dim = data.get("head_dim"), data.get("global_head_dim")
    if not is_int(global_dim) or global_dim == head_dim:
        raise _err(where, "global_head_dim", f"is {global_dim!r} (head_dim {head_dim!r}) and the config has no "
                                             "attention_layer_types: which layers slide cannot be told")
    kinds = []
    for i, d in enumerate(dims):
        if d not in (head_dim, global_dim):
            raise _err(where, f"kv_layer_configs[{i}].head_dim", f"is {d}, neither head_dim ({head_dim}) nor "
                                                                 f"global_head_dim ({global_dim})")
        kinds.append("full" if d == global_dim else "sliding")
    return tuple(kinds)


def _window(data: Mapping[str, Any], table: Sequence[Mapping[str, Any]], kinds: Sequence[str],
            capacity: int, where: str) -> int:
    """W from ``sliding_window_size`` / ``sliding_window`` and the sliding layers' reduced capacities: all that are
    written must agree."""
    seen: list[tuple[str, int]] = []
    for key in ("sliding_window_size", "sliding_window"):
        if data.get(key) is not None:
            seen.append((key, _int(data, key, where, low=1)))
    for i, entry in enumerate(table):
        cap = entry.get("kv_cache_capacity")
        if cap is None:
            continue
        key = f"kv_layer_configs[{i}].kv_cache_capacity"
        if not is_int(cap) or cap < 1:
            raise _err(where, key, f"expected an int >= 1, got {_got(cap)}")
        if kinds[i] == "full" and cap < capacity:
            raise _err(where, key, f"is {cap} on a full-attention layer (the model's capacity is {capacity}): a "
                                   "reduced capacity marks a sliding layer")
        if kinds[i] == "sliding" and cap < capacity:
            seen.append((key, int(cap)))
    for key, w in seen[1:]:
        if w != seen[0][1]:
            raise _err(where, key, f"is {w} but {seen[0][0]} is {seen[0][1]}: the sliding window is ambiguous")
    return seen[0][1] if seen else 0


def read_gemma4(data: Mapping[str, Any], where: str, *, capacity: int) -> Gemma4Config:
    """The Gemma 4 facts of an Edge-LLM config (see the module docstring); ``capacity`` is
    ``builder_config.max_kv_cache_capacity``. Raises :class:`ConfigError` naming ``where`` and the key."""
    table = data.get("kv_layer_configs")
    if not isinstance(table, list) or not table or not all(isinstance(e, Mapping) for e in table):
        raise _err(where, "kv_layer_configs", f"expected one object per attention layer on a Gemma 4 config, got "
                                              f"{_got(table)}")
    n = len(table)
    heads: list[int] = []
    dims: list[int] = []
    for i, entry in enumerate(table):
        extra = sorted(set(entry) - {"num_kv_heads", "head_dim", "kv_cache_capacity"})
        if extra:
            raise _err(where, f"kv_layer_configs[{i}].{extra[0]}", "is not a per-layer KV key trtio knows; refused "
                                                                   "rather than ignored")
        for key, out in (("num_kv_heads", heads), ("head_dim", dims)):
            v = entry.get(key)
            if not is_int(v) or v < 1:
                raise _err(where, f"kv_layer_configs[{i}].{key}", f"expected an int >= 1, got {_got(v)}")
            out.append(int(v))
    q_heads = data.get("num_attention_heads")
    for i, h in enumerate(heads):
        if is_int(q_heads) and q_heads % h:
            raise _err(where, f"kv_layer_configs[{i}].num_kv_heads", f"{h} must divide num_attention_heads "
                                                                     f"({q_heads})")
    kinds = _kinds(data, heads, dims, where)
    global_heads = data.get("num_global_key_value_heads")
    if global_heads is not None:
        for i in (i for i, k in enumerate(kinds) if k == "full"):
            if heads[i] != global_heads:
                raise _err(where, f"kv_layer_configs[{i}].num_kv_heads",
                           f"is {heads[i]} but num_global_key_value_heads is {global_heads}")
    if data.get("attention_k_eq_v"):
        raise _err(where, "attention_k_eq_v", "marks K == V attention layers, whose KV pools trtio cannot lay out "
                                              "yet; the config is refused rather than bound wrong")
    donors = data.get("kv_sharing_donors", [-1] * n)
    if not isinstance(donors, list) or len(donors) != n or not all(is_int(d) for d in donors):
        raise _err(where, "kv_sharing_donors", f"expected {n} ints (-1 or a donor layer), got {_got(donors)}")
    for i, d in enumerate(donors):
        key = f"kv_sharing_donors[{i}]"
        if d == -1:
            continue
        if not 0 <= d < i:
            raise _err(where, key, f"is {d}: a donor is an earlier layer (0 .. {i - 1}) or -1")
        if donors[d] != -1:
            raise _err(where, key, f"is {d}, itself a consumer of layer {donors[d]}: name the owner of the pool")
        if (kinds[d], heads[d], dims[d]) != (kinds[i], heads[i], dims[i]):
            raise _err(where, key, f"layer {i} ({kinds[i]}, {heads[i]} x {dims[i]}) cannot read the KV pool of "
                                   f"layer {d} ({kinds[d]}, {heads[d]} x {dims[d]})")
    window = _window(data, table, kinds, capacity, where)
    swa_pages = _int(data.get("builder_config") or {}, "num_swa_pages", where, low=0)
    sliding_dim = next((dims[i] for i, k in enumerate(kinds) if k == "sliding"), dims[0])
    full_dim = next((dims[i] for i, k in enumerate(kinds) if k == "full"), dims[0])
    sliding = _rope(data, "sliding_rope_config", sliding_dim, where)
    full = _rope(data, "full_rope_config", full_dim, where)
    ple = data.get("ple_enabled")
    if ple is not None and not isinstance(ple, bool):
        raise _err(where, "ple_enabled", f"expected true or false, got {_got(ple)}")
    n_ple, ple_hidden = _int(data, "num_ple_inputs", where), _int(data, "ple_hidden_size", where)
    if ple or (ple is None and (n_ple or ple_hidden)):
        if n_ple != n:
            raise _err(where, "num_ple_inputs", f"is {n_ple}, but PLE feeds each of the {n} layers one input")
        if ple_hidden < 1:
            raise _err(where, "ple_hidden_size", f"expected an int >= 1 with PLE enabled, got {ple_hidden}")
    else:
        n_ple = ple_hidden = 0
    return Gemma4Config(kinds, tuple(heads), tuple(dims), tuple(int(d) for d in donors), window, swa_pages, sliding,
                        full, ple_hidden, n_ple)


#: The keys :func:`read_gemma4` reads (the mapping marks them used, so they leave ``extras``).
GEMMA4_KEYS = ("global_head_dim", "attention_layer_types", "num_global_key_value_heads", "attention_k_eq_v",
               "kv_sharing_donors", "sliding_window_size", "sliding_window", "builder_config.num_swa_pages",
               "sliding_rope_config", "full_rope_config", "ple_enabled", "num_ple_inputs", "ple_hidden_size")


# -- the SWA mode a setup binds -----------------------------------------------------------------------------

def choose_swa_mode(cfg: LLMEngineConfig, max_batch: int, *, engine_mode_max: int, engine_swa_pages: tuple[int, int],
                    prefix_reuse: bool = False, spec_decode: bool = False,
                    force_full: bool = False) -> SwaMode:
    """The SWA mode for ``max_batch`` sequences of a Gemma 4 engine: bounded where the engine declares it
    (``engine_mode_max`` = the largest ``swa_kv_cache_mode`` extent its profiles take, ``engine_swa_pages`` = the
    (min, max) pages its sliding pools take), the config says the window, the budget ``max_batch x private pages``
    is below the full pool and nothing forces full mode (prefix reuse, FP8 KV, spec decode, ``force_full``)."""
    g = cfg.feature(Gemma4Config)
    if g is None:
        raise ConfigError("gemma4", "choose_swa_mode needs a Gemma 4 config")
    full_pages = cfg.kv_pool_pages

    def full(reason: str) -> SwaMode:
        return SwaMode(False, full_pages, 0, reason)

    if not any(g.is_sliding(i) for i in range(g.num_layers)):
        return full("the model has no sliding layer")
    if force_full:
        return full("full mode was asked for")
    if engine_mode_max < 1:
        return full(f"the engine's swa_kv_cache_mode profile takes length {engine_mode_max} at most (built without "
                    "a bounded SWA pool)")
    if not g.sliding_window:
        return full("the config writes no sliding window (sliding_window_size or a sliding layer's "
                    "kv_layer_configs[i].kv_cache_capacity), so the bounded pool cannot be sized")
    if cfg.kv_cache_dtype == "float8_e4m3fn" or cfg.kv_dtype.itemsize == 1:
        return full(f"FP8 KV cache ({cfg.kv_cache_dtype}) forces full mode, as in Edge-LLM")
    if spec_decode:
        return full("speculative decoding forces full mode, as in Edge-LLM")
    if prefix_reuse:
        return full("prefix reuse (pin_prefix) forces full mode, as in Edge-LLM")
    private = g.private_pages(cfg.kv_page_size)
    budget = g.num_swa_pages or max_batch * private
    if budget < max_batch * private:
        return full(f"builder_config.num_swa_pages ({budget}) is below {max_batch} sequences x {private} pages")
    if budget >= full_pages:
        return full(f"the bounded budget ({max_batch} sequences x {private} pages = {budget}) is not below the full "
                    f"pool ({full_pages} pages)")
    lo, hi = engine_swa_pages
    if not lo <= budget <= hi:
        return full(f"the engine's sliding pools take {lo} .. {hi} pages, not the bounded budget {budget}")
    return SwaMode(True, budget, private,
                   f"window {g.sliding_window} tokens: {max_batch} sequences x {private} pages instead of "
                   f"{full_pages}")


def bound_swa_mode(cfg: LLMEngineConfig, eio: EngineIO, max_batch: int, *, bounded_ok: str = "") -> SwaMode:
    """The SWA mode a setup binds for ``eio`` (a Gemma 4 engine's declared I/O): :func:`choose_swa_mode`'s, with the
    engine's mode profile and sliding pool range; ``bounded_ok``, where not empty, says why the setup binds the full
    mode where the bounded one would fit."""
    mode_max = eio[names.kSwaKVCacheMode].max_shape()[0] if names.kSwaKVCacheMode in eio else 0
    g = cfg.feature(Gemma4Config)
    assert g is not None
    lo, hi = cfg.kv_pool_pages, cfg.kv_pool_pages
    for i in range(g.num_layers):
        past = names.past_key_values(i)
        if g.is_sliding(i) and past in eio and eio[past].profiles:
            lo = min(lo, min(p[0][1] for p in eio[past].profiles))
            hi = max(hi, max(p[2][1] for p in eio[past].profiles))
    possible = choose_swa_mode(cfg, max_batch, engine_mode_max=mode_max, engine_swa_pages=(lo, hi))
    if possible.bounded and bounded_ok:
        return SwaMode(False, cfg.kv_pool_pages, 0, f"the engine and config allow the {possible.describe()}, but "
                                                    f"{bounded_ok}")
    return possible


def q_only_consumers(g: Gemma4Config, swa_inputs: bool) -> tuple[int, ...]:
    """The KV-sharing layers Edge-LLM 0.11's exporter gives Q only (``enable_kv_shared`` 1,
    ``models/gemma4/modeling_gemma4_text.py::forward_ragged``): every full-attention consumer, and a sliding one
    where the engine has no SWA inputs (with them, a sliding consumer gets its donor's current K/V)."""
    return tuple(i for i, d in enumerate(g.donors) if d >= 0 and (not g.is_sliding(i) or not swa_inputs))


def check_cached_prefix_step(g: Gemma4Config, swa_inputs: bool, past: np.ndarray, what: str) -> None:
    """Refuse a prefill over cached tokens (``past_lengths=`` or ``prefix=``: phase 2 with a cached prefix) on an
    engine with Q-only KV-sharing layers: Edge-LLM 0.11's AttentionPlugin rotates their queries with RoPE row
    ``past + i`` of the step's token-aligned table instead of row ``i`` (``attentionPlugin.cpp``'s shared-KV
    prefill calls ``launchApplyRopeQOnly`` with ``kvCacheEndLens``), so their logits would be wrong
    (``docs/edgellm-assumptions.md`` §10.9)."""
    layers = q_only_consumers(g, swa_inputs)
    if layers and (past > 0).any():
        raise InvalidValueError(
            f"{what}: a prefill over cached tokens (past_lengths= or prefix=) on this Gemma 4 engine would give wrong "
            f"logits: Edge-LLM 0.11's AttentionPlugin rotates the queries of its KV-sharing layers {list(layers)} (Q "
            "only) with RoPE row past + i of the step's table instead of row i (launchApplyRopeQOnly with "
            "kvCacheEndLens); prefill each prompt whole")


# -- Edge-LLM's keys: the top-level RoPE, and what only Gemma 4 binds -------------------------------------------

def _top_rope(r: EdgeReader, g: Gemma4Config) -> tuple[int, float, RopeScaling | None]:
    """Gemma 4's top-level ``rope_theta`` / ``partial_rotary_factor`` / ``rope_scaling`` copy its full layers'
    RoPE (``full_rope_config``), which is what is computed; a copy that differs is refused. trtio's single-table
    fields then describe the sliding layers' table (``LLMEngineConfig.gemma4`` holds both)."""
    full = g.full_rope
    theta = r.number("rope_theta", default=full.theta, low=0.0)
    factor = r.number("partial_rotary_factor", default=full.partial_rotary_factor, low=0.0, high=1.0)
    scaling = r.take("rope_scaling", "null or an object", required=False)
    kind = None if scaling is None else scaling.get("rope_type", scaling.get("type")) \
        if isinstance(scaling, Mapping) else scaling
    for key, top, want in (("rope_theta", theta, full.theta), ("partial_rotary_factor", factor,
                                                               full.partial_rotary_factor),
                           ("rope_scaling", kind, None if scaling is None else full.rope_type)):
        if top != want:
            raise r.error(key, f"is {top!r} but full_rope_config says {want!r}: the top-level RoPE keys of a Gemma 4 "
                               "config copy its full layers' RoPE")
    s = g.sliding_rope
    return s.width, s.theta, s.scaling


def _nonzero_int(r: EdgeReader, key: str) -> int:
    value = r.raw(key)
    if value is None:
        return 0
    if not is_int(value) or value < 0:
        raise r.error(key, f"expected an int >= 0, got {got(value)}")
    return int(value)


def _kv_layer_problem(r: EdgeReader) -> str | None:
    """Why ``kv_layer_configs`` describes per-layer KV shapes, or None where every entry is the
    top-level shape."""
    configs = r.raw("kv_layer_configs")
    if configs is None:
        return None
    if not isinstance(configs, list):
        raise r.error("kv_layer_configs", f"expected a list (one entry per layer), got {got(configs)}")
    heads, dim = r.raw("num_key_value_heads"), r.raw("head_dim")
    shapes = set()
    for i, entry in enumerate(configs):
        if entry is None:
            continue  # a recurrent layer: reported as hybrid
        if not isinstance(entry, Mapping):
            raise r.error(f"kv_layer_configs[{i}]", f"expected an object or null, got {got(entry)}")
        if "kv_cache_capacity" in entry:
            return f"layer {i} has its own KV cache capacity ({entry['kv_cache_capacity']!r})"
        shapes.add((entry.get("num_kv_heads"), entry.get("head_dim")))
    odd = sorted((s for s in shapes if s != (heads, dim)), key=repr)
    if odd:
        return (f"layers use KV heads x head_dim {', '.join(f'{h} x {d}' for h, d in odd)}, "
                f"not only the top-level {heads} x {dim}")
    return None


def _per_layer_kv_dims(r: EdgeReader) -> list[Found]:
    """Per-layer KV head dims (Gemma-4: global layers with their own head_dim / KV heads)."""
    global_dim = r.raw("global_head_dim")
    if global_dim not in (None, 0) and global_dim != r.raw("head_dim"):
        return [("global_head_dim", "per-layer KV head dims", f"global layers use head_dim {global_dim!r}, "
                 f"the others {r.raw('head_dim')!r}")]
    problem = _kv_layer_problem(r)
    if problem is not None:
        return [("kv_layer_configs", "per-layer KV head dims", problem)]
    global_heads = r.raw("num_global_key_value_heads")
    if global_heads not in (None, 0) and global_heads != r.raw("num_key_value_heads"):
        return [("num_global_key_value_heads", "per-layer KV head dims",
                 f"global layers use {global_heads!r} KV heads, the others {r.raw('num_key_value_heads')!r}")]
    if r.bool_("attention_k_eq_v"):
        return [("attention_k_eq_v", "per-layer KV head dims", "K == V attention layers")]
    return []


def _kv_sharing(r: EdgeReader) -> list[Found]:
    """KV sharing (Gemma-4: later layers read an earlier layer's KV cache; drafts that read the target's)."""
    donors = r.raw("kv_sharing_donors")
    if donors is not None:
        if not isinstance(donors, list):
            raise r.error("kv_sharing_donors", f"expected a list (one donor index or -1 per layer), got {got(donors)}")
        shared = [i for i, d in enumerate(donors) if d != -1]
        if shared:
            return [("kv_sharing_donors", "KV sharing", f"layers {shared} read the KV cache of layers "
                     f"{[donors[i] for i in shared]}")]
        return []
    if _nonzero_int(r, "num_kv_shared_layers"):
        return [("num_kv_shared_layers", "KV sharing", f"{r.raw('num_kv_shared_layers')} layers read another "
                 "layer's KV cache")]
    if r.raw("kv_sharing_map"):
        return [("kv_sharing_map", "KV sharing", "the draft reads the target's KV cache")]
    if r.bool_("shares_target_kv"):
        return [("shares_target_kv", "KV sharing", "the draft reads the target's KV cache")]
    return []


def _dual_rope(r: EdgeReader) -> list[Found]:
    """Sliding-window layers with their own RoPE (two cos/sin tables) and KV pool."""
    found: list[Found] = []
    for key in ("sliding_rope_config", "full_rope_config", "sliding_rotary_dim", "global_rope_theta"):
        if r.raw(key) is not None:
            found.append((key, "sliding-window dual RoPE", "sliding and full attention layers use different RoPE "
                          "tables (rope_rotary_cos_sin and rope_rotary_cos_sin_sliding)"))
            break
    if _nonzero_int(r, "builder_config.num_swa_pages"):
        found.append(("builder_config.num_swa_pages", "sliding-window dual RoPE",
                      f"sliding layers use a KV pool of {r.raw('builder_config.num_swa_pages')} pages of their own"))
    return found


def _per_layer_embeddings(r: EdgeReader) -> list[Found]:
    """Per-layer embeddings (Gemma-4 "PLE": an extra per-layer input table)."""
    ple = r.bool_("ple_enabled")
    n_ple, ple_hidden = _nonzero_int(r, "num_ple_inputs"), _nonzero_int(r, "ple_hidden_size")
    if not (ple or n_ple or ple_hidden):
        return []
    key = "ple_enabled" if ple else ("num_ple_inputs" if n_ple else "ple_hidden_size")
    return [(key, "per-layer embeddings (Gemma PLE)", f"num_ple_inputs {n_ple}, ple_hidden_size {ple_hidden}: a "
             "per-layer input table trtio does not allocate")]
