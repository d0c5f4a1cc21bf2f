"""TensorSpec and the per-role registries: each binding's name, direction, dtype and symbolic shape.

A shape is a tuple of dims; a dim is a fixed ``int``, the name of an :class:`InferenceDims`
member (``"batch"``), or a tuple of member names whose product it is (``("batch", "select_len")``
for logits rows). Resolving a spec against the step's dims gives the binding's shape, so every
shape comes from one place: the recipe that made the dims.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

from trtio import names
from trtio.config import LLMEngineConfig
from trtio.dims import InferenceDims
from trtio.dtypes import DType

__all__ = ["TensorSpec", "TensorRegistry", "Dim", "build_registry_for_llm",
           "build_registry_for_spec_decode_draft", "build_registry"]

Dim = int | str | tuple[str, ...]


@dataclass(frozen=True)
class TensorSpec:
    """One binding of an engine: ``io`` is "input" or "output"."""

    name: str
    io: str
    dtype: DType
    shape: tuple[Dim, ...]

    @property
    def is_input(self) -> bool:
        return self.io == "input"

    def members(self) -> set[str]:
        """The InferenceDims members this shape refers to."""
        out: set[str] = set()
        for d in self.shape:
            if isinstance(d, str):
                out.add(d)
            elif isinstance(d, tuple):
                out.update(d)
        return out

    def resolve(self, dims: InferenceDims) -> tuple[int, ...]:
        out = []
        for d in self.shape:
            if isinstance(d, int):
                out.append(d)
            elif isinstance(d, str):
                out.append(getattr(dims, d))
            else:
                out.append(math.prod(getattr(dims, m) for m in d))
        return tuple(out)

    def __str__(self) -> str:
        def fmt(d: Dim) -> str:
            return "*".join(d) if isinstance(d, tuple) else str(d)

        return f"{self.name} ({self.io}, {self.dtype}, [{', '.join(fmt(d) for d in self.shape)}])"


class TensorRegistry:
    """An ordered, name-unique set of TensorSpecs for one engine role."""

    def __init__(self, role: str, specs: list[TensorSpec] | None = None) -> None:
        self.role = role
        self._specs: dict[str, TensorSpec] = {}
        for s in specs or ():
            self.add(s)

    def add(self, spec: TensorSpec) -> None:
        if spec.name in self._specs:
            raise ValueError(f"registry {self.role!r}: {spec.name!r} is declared twice")
        if len(spec.shape) > 8:
            raise ValueError(f"registry {self.role!r}: {spec.name!r} has rank {len(spec.shape)} > 8")
        self._specs[spec.name] = spec

    def get(self, name: str) -> TensorSpec | None:
        return self._specs.get(name)

    def __getitem__(self, name: str) -> TensorSpec:
        return self._specs[name]

    def __contains__(self, name: object) -> bool:
        return name in self._specs

    def __iter__(self) -> Iterator[TensorSpec]:
        return iter(self._specs.values())

    def __len__(self) -> int:
        return len(self._specs)

    def names(self) -> list[str]:
        return list(self._specs)

    def referenced_members(self) -> set[str]:
        out: set[str] = set()
        for s in self._specs.values():
            out |= s.members()
        return out

    def resolve_all(self, dims: InferenceDims) -> dict[str, tuple[int, ...]]:
        dims.check(self.referenced_members())
        return {n: s.resolve(dims) for n, s in self._specs.items()}


def _common(reg: TensorRegistry, cfg: LLMEngineConfig) -> None:
    act = cfg.activation
    i32, i64, f32 = DType.INT32, DType.INT64, DType.FLOAT32
    reg.add(TensorSpec(names.kContextLengths, "input", i32, ("batch",)))
    reg.add(TensorSpec(names.kLastTokenIds, "input", i64, ("batch", "select_len")))
    reg.add(TensorSpec(names.kKVCacheStartIndex, "input", i32, ("start_index_len",)))
    reg.add(TensorSpec(names.kRopeCosSin, "input", f32, ("rope_batch", "kv_len", cfg.rotary_dim)))
    for i in range(cfg.num_deepstack_features):
        reg.add(TensorSpec(names.deepstack_embeds(i), "input", act, ("batch", "seq_len", cfg.hidden_size)))
    kv = cfg.kv_dtype
    cache_shape: tuple[Dim, ...] = ("batch", cfg.num_kv_heads, "kv_len", cfg.head_dim)
    for i in range(cfg.num_attention_layers):
        reg.add(TensorSpec(names.k_cache(i), "input", kv, cache_shape))
        reg.add(TensorSpec(names.v_cache(i), "input", kv, cache_shape))
        reg.add(TensorSpec(names.present_k_cache(i), "output", kv, cache_shape))
        reg.add(TensorSpec(names.present_v_cache(i), "output", kv, cache_shape))
    reg.add(TensorSpec(names.kLogits, "output", f32, (("batch", "select_len"), cfg.output_vocab_size)))
    reg.add(TensorSpec(names.kOutputHiddenStates, "output", act, ("batch", "seq_len", cfg.hidden_size)))


def _tree_inputs(reg: TensorRegistry) -> None:
    reg.add(TensorSpec(names.kAttentionMask, "input", DType.INT32,
                       ("batch", "attn_mask_seq_len", "packed_mask_len")))
    reg.add(TensorSpec(names.kAttentionPosId, "input", DType.INT32, ("batch", "attn_mask_seq_len")))


def build_registry_for_llm(cfg: LLMEngineConfig) -> TensorRegistry:
    """A plain LLM or a spec-decode base (the base adds the tree mask and position ids)."""
    reg = TensorRegistry("base" if cfg.is_spec_decode_base else "llm")
    reg.add(TensorSpec(names.kInputsEmbeds, "input", cfg.activation, ("batch", "seq_len", cfg.hidden_size)))
    _common(reg, cfg)
    if cfg.is_spec_decode_base:
        _tree_inputs(reg)
    return reg


def build_registry_for_spec_decode_draft(cfg: LLMEngineConfig) -> TensorRegistry:
    """An EAGLE-style draft: base hidden states and its own previous hidden states come in."""
    reg = TensorRegistry("draft")
    act = cfg.activation
    reg.add(TensorSpec(names.kInputsEmbeds, "input", act, ("batch", "seq_len", cfg.hidden_size)))
    reg.add(TensorSpec(names.kBaseModelHiddenStates, "input", act,
                       ("batch", "seq_len", cfg.base_model_hidden_size)))
    reg.add(TensorSpec(names.kDraftModelHiddenStates, "input", act, ("batch", "seq_len", cfg.hidden_size)))
    _common(reg, cfg)
    _tree_inputs(reg)
    return reg


def build_registry(cfg: LLMEngineConfig) -> TensorRegistry:
    """The registry for ``cfg.role``."""
    return build_registry_for_spec_decode_draft(cfg) if cfg.is_draft else build_registry_for_llm(cfg)
