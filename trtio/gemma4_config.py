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
from typing import Any

import numpy as np

from trtio._checks import is_int
from trtio._json import json_kind
from trtio.errors import ConfigError
from trtio.rope import RopeScaling, proportional_rope_parameters, rope_cos_sin_rows, rope_parameters

__all__ = ["SWA_REPLACEMENT_PAGES", "Gemma4Config", "LayerRope", "is_gemma4", "read_gemma4", "swa_private_pages"]

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
class Gemma4Config:
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
