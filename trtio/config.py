"""Engine and deployment configs: frozen, validated once, JSON in and out, with the shape recipes.

Field names follow Edge-LLM's ``LLMEngineConfig`` / ``SpecDecodeConfig`` / ``DeploymentConfig`` in
snake_case. ``validate()`` raises :class:`ConfigError` naming the field and the value.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Mapping
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any

from trtio.dims import InferenceDims
from trtio.dtypes import DType
from trtio.errors import ConfigError, ShapeError

__all__ = ["LLMEngineConfig", "SpecDecodeConfig", "DeploymentConfig", "read_config"]

log = logging.getLogger("trtio")

_ACTIVATION_DTYPES = ("float16", "bfloat16", "float32")
_KV_DTYPES = ("float16", "bfloat16", "float32", "fp8", "int8")
_ROPE_TYPES = ("rope", "mrope")
# Top-level keys a deployment JSON may carry besides base / draft / spec.
_DEPLOYMENT_EXTRA_KEYS = ("name", "description", "seed")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _positive(obj: Any, *names: str) -> None:
    for name in names:
        v = getattr(obj, name)
        if not _is_int(v) or v <= 0:
            raise ConfigError(name, f"must be a positive int, got {v!r}")


def _non_negative(obj: Any, *names: str) -> None:
    for name in names:
        v = getattr(obj, name)
        if not _is_int(v) or v < 0:
            raise ConfigError(name, f"must be a non-negative int, got {v!r}")


def _dtype_name(value: Any) -> Any:
    """Normalise a dtype given as DType, numpy dtype or TensorRT name to trtio's name ("float16")."""
    try:
        return str(DType.coerce(value))
    except ValueError:
        return value  # validate() reports it with the field's name


def _from_mapping(cls: type, data: Mapping[str, Any], what: str) -> Any:
    if not isinstance(data, Mapping):
        raise ConfigError(what, f"must be a JSON object, got {type(data).__name__}")
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"{what}.{unknown[0]}", f"is not a {cls.__name__} field; known fields: {sorted(known)}")
    try:
        return cls(**data)
    except TypeError as exc:
        missing = [f.name for f in fields(cls)
                   if f.name not in data and f.default is MISSING and f.default_factory is MISSING]
        raise ConfigError(f"{what}.{missing[0]}" if missing else what, f"is required ({exc})") from None


def _read_json(path: str | os.PathLike[str]) -> Any:
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except FileNotFoundError:
        raise ConfigError(str(path), "no such config file") from None
    except IsADirectoryError:
        raise ConfigError(str(path), "is a directory, not a config file") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(str(path), f"is not UTF-8 text: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(str(path), f"is not valid JSON: {exc}") from None


def _write_json(path: str | os.PathLike[str], data: Any) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=2)
        fh.write("\n")


@dataclass(frozen=True)
class LLMEngineConfig:
    """What trtio needs to know about one LLM engine (base, draft or plain)."""

    hidden_size: int
    vocab_size: int
    max_supported_batch_size: int
    max_supported_input_length: int
    max_kv_cache_capacity: int
    num_attention_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    rotary_dim: int | None = None  # default: head_dim
    output_vocab_size: int | None = None  # default: vocab_size
    activation_dtype: str = "float16"
    kv_cache_dtype: str = "float16"
    num_deepstack_features: int = 0
    rope_type: str = "rope"
    rope_theta: float = 10000.0
    is_spec_decode_base: bool = False
    base_model_hidden_size: int = 0  # a draft's view of the base output width; 0 if not a draft
    max_verify_tree_size: int = 0  # spec-decode base: most tokens one verify step takes
    max_draft_tree_size: int = 0  # draft: most tokens one proposal / accept step takes
    contract: str | None = None  # "batch" | "ragged"; None: the engine's
    kv_page_size: int = 128  # paged KV (ragged contract): tokens per page
    kv_pool_pages: int = 0  # pages per layer pool; 0: max batch x pages per sequence
    eagle_hidden_state_layers: tuple[int, ...] = ()  # EAGLE3 base: layers whose hidden states feed the draft

    def __post_init__(self) -> None:
        object.__setattr__(self, "eagle_hidden_state_layers", tuple(self.eagle_hidden_state_layers))
        if self.kv_pool_pages == 0 and _is_int(self.kv_page_size) and self.kv_page_size > 0:
            object.__setattr__(self, "kv_pool_pages", self.max_supported_batch_size * self.pages_per_sequence)
        if self.output_vocab_size is None:
            object.__setattr__(self, "output_vocab_size", self.vocab_size)
        if self.rotary_dim is None:
            object.__setattr__(self, "rotary_dim", self.head_dim)
        object.__setattr__(self, "activation_dtype", _dtype_name(self.activation_dtype))
        object.__setattr__(self, "kv_cache_dtype", _dtype_name(self.kv_cache_dtype))

    # -- roles --------------------------------------------------------------------------------
    @property
    def is_draft(self) -> bool:
        return self.base_model_hidden_size > 0

    @property
    def role(self) -> str:
        """"base" (spec-decode base), "draft" (EAGLE-style draft) or "llm"."""
        if self.is_spec_decode_base:
            return "base"
        return "draft" if self.is_draft else "llm"

    @property
    def pages_per_sequence(self) -> int:
        """KV pages one sequence needs: ceil(max_kv_cache_capacity / kv_page_size)."""
        return -(-self.max_kv_cache_capacity // self.kv_page_size)

    @property
    def is_mrope(self) -> bool:
        return self.rope_type == "mrope"

    @property
    def activation(self) -> DType:
        return DType.coerce(self.activation_dtype)

    @property
    def kv_dtype(self) -> DType:
        return DType.coerce(self.kv_cache_dtype)

    @property
    def max_step_tokens(self) -> int:
        """Most tokens a non-prefill step takes (1 for a plain LLM)."""
        if self.role == "base":
            return self.max_verify_tree_size
        if self.role == "draft":
            return self.max_draft_tree_size
        return 1

    # -- validation ---------------------------------------------------------------------------
    def validate(self) -> LLMEngineConfig:
        """Check every field; raise ConfigError naming the first bad one. Returns self."""
        _positive(self, "hidden_size", "vocab_size", "output_vocab_size", "max_supported_batch_size",
                  "max_supported_input_length", "max_kv_cache_capacity", "num_attention_layers",
                  "num_attention_heads", "num_kv_heads", "head_dim", "rotary_dim")
        _non_negative(self, "num_deepstack_features", "base_model_hidden_size", "max_verify_tree_size",
                      "max_draft_tree_size")
        if self.num_attention_heads % self.num_kv_heads:
            raise ConfigError("num_kv_heads", f"{self.num_kv_heads} must divide num_attention_heads "
                                              f"({self.num_attention_heads})")
        if self.rotary_dim % 2 or self.rotary_dim > self.head_dim:
            raise ConfigError("rotary_dim", f"must be even and <= head_dim ({self.head_dim}), got {self.rotary_dim}")
        if self.activation_dtype not in _ACTIVATION_DTYPES:
            raise ConfigError("activation_dtype", f"must be one of {_ACTIVATION_DTYPES}, got {self.activation_dtype!r}")
        if self.kv_cache_dtype not in _KV_DTYPES:
            raise ConfigError("kv_cache_dtype", f"must be one of {_KV_DTYPES}, got {self.kv_cache_dtype!r}")
        if self.rope_type not in _ROPE_TYPES:
            raise ConfigError("rope_type", f"must be one of {_ROPE_TYPES}, got {self.rope_type!r}")
        if not isinstance(self.rope_theta, (int, float)) or isinstance(self.rope_theta, bool) or self.rope_theta <= 0:
            raise ConfigError("rope_theta", f"must be a positive number, got {self.rope_theta!r}")
        if not isinstance(self.is_spec_decode_base, bool):
            raise ConfigError("is_spec_decode_base", f"must be true or false, got {self.is_spec_decode_base!r}")
        if self.max_kv_cache_capacity < self.max_supported_input_length:
            raise ConfigError("max_kv_cache_capacity",
                              f"{self.max_kv_cache_capacity} cannot hold max_supported_input_length "
                              f"({self.max_supported_input_length}) prompt tokens")
        if self.num_deepstack_features > self.num_attention_layers:
            raise ConfigError("num_deepstack_features",
                              f"{self.num_deepstack_features} exceeds num_attention_layers "
                              f"({self.num_attention_layers})")
        if self.is_spec_decode_base and self.is_draft:
            raise ConfigError("base_model_hidden_size", "a spec-decode base cannot also be a draft (set it to 0)")
        if self.is_spec_decode_base and self.max_verify_tree_size <= 0:
            raise ConfigError("max_verify_tree_size",
                              f"a spec-decode base needs a positive value, got {self.max_verify_tree_size}")
        if self.is_draft and self.max_draft_tree_size <= 0:
            raise ConfigError("max_draft_tree_size", f"a draft needs a positive value, got {self.max_draft_tree_size}")
        if self.contract not in (None, "batch", "ragged"):
            raise ConfigError("contract", f"must be 'batch', 'ragged' or null (from the engine), got {self.contract!r}")
        _positive(self, "kv_page_size", "kv_pool_pages")
        need = self.max_supported_batch_size * self.pages_per_sequence
        if self.kv_pool_pages < need:
            raise ConfigError("kv_pool_pages", f"{self.kv_pool_pages} pages cannot hold max_supported_batch_size "
                                               f"({self.max_supported_batch_size}) x {self.pages_per_sequence} pages "
                                               f"per sequence = {need}")
        if any(not _is_int(i) or not 0 <= i < self.num_attention_layers for i in self.eagle_hidden_state_layers):
            raise ConfigError("eagle_hidden_state_layers",
                              f"must be layer indices in 0..{self.num_attention_layers - 1}, "
                              f"got {list(self.eagle_hidden_state_layers)}")
        if self.max_step_tokens > self.max_kv_cache_capacity:
            raise ConfigError("max_kv_cache_capacity", f"{self.max_kv_cache_capacity} is smaller than one step "
                                                       f"({self.max_step_tokens} tokens)")
        return self

    # -- JSON ---------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, what: str = "LLMEngineConfig") -> LLMEngineConfig:
        return _from_mapping(cls, data, what).validate()

    @classmethod
    def from_json(cls, path: str | os.PathLike[str]) -> LLMEngineConfig:
        return cls.from_dict(_read_json(path), what=str(path))

    def to_json(self, path: str | os.PathLike[str]) -> None:
        _write_json(path, self.to_dict())

    # -- shape recipes (Edge-LLM's llmEngineConfig.cpp) ------------------------------------------
    def _rope_batch(self, batch: int) -> int:
        return batch if self.is_mrope else 1

    def _check_batch(self, batch: int) -> None:
        if not _is_int(batch) or not 1 <= batch <= self.max_supported_batch_size:
            raise ShapeError(f"batch must be an int in 1..{self.max_supported_batch_size} "
                             f"(max_supported_batch_size), got {batch!r}")

    @staticmethod
    def _check_len(what: str, value: int, limit: int, limit_name: str) -> None:
        if not _is_int(value) or not 1 <= value <= limit:
            raise ShapeError(f"{what} must be an int in 1..{limit} ({limit_name}), got {value!r}")

    def _dims(self, batch: int, seq: int, select: int, attn: int, start: int, *, execution_phase: int,
              phase: int = 0, rope_batch: int | None = None) -> InferenceDims:
        context = batch if execution_phase in (1, 2) else 0  # the ragged contract's prefill sequences
        return InferenceDims(
            batch=batch, seq_len=seq, kv_len=self.max_kv_cache_capacity, select_len=select,
            attn_mask_seq_len=attn, rope_batch=self._rope_batch(batch) if rope_batch is None else rope_batch,
            packed_mask_len=math.ceil(attn / 32), context_mask_selector_len=0, start_index_len=start,
            spec_verify_phase_len=phase, skip_softmax_scale_len=0, query_offsets_len=batch + 1,
            execution_phase_len=execution_phase, context_seq_len=context)

    def prefill_dims(self, batch: int, seq_len: int, kv_cache_empty: bool = True) -> InferenceDims:
        """Prompt step: ``seq_len`` tokens per sequence, one logits row each, causal mask (phase 1, or 2
        after a restored prefix)."""
        self._check_batch(batch)
        self._check_len("seq_len", seq_len, self.max_supported_input_length, "max_supported_input_length")
        return self._dims(batch, seq_len, 1, 1, 0 if kv_cache_empty else batch,
                          execution_phase=1 if kv_cache_empty else 2)

    def decode_dims(self, batch: int) -> InferenceDims:
        """One token per sequence after the cached ones (phase 3)."""
        self._check_batch(batch)
        return self._dims(batch, 1, 1, 1, batch, execution_phase=3)

    def spec_verify_dims(self, batch: int, verify_size: int) -> InferenceDims:
        """Base verify over a tree of ``verify_size`` nodes: logits for every node (phase 5)."""
        self._check_batch(batch)
        self._check_len("verify_size", verify_size, self.max_verify_tree_size, "max_verify_tree_size")
        return self._dims(batch, verify_size, verify_size, verify_size, batch, phase=1, execution_phase=5)

    def proposal_dims(self, batch: int, proposal_size: int, top_k: int) -> InferenceDims:
        """Draft proposal over a tree of ``proposal_size`` rows, ``top_k`` logits rows per sequence (phase 4;
        3 when one row wide)."""
        self._check_batch(batch)
        self._check_len("proposal_size", proposal_size, self.max_draft_tree_size, "max_draft_tree_size")
        self._check_len("top_k", top_k, proposal_size, "proposal_size")
        return self._dims(batch, proposal_size, top_k, proposal_size, batch,
                          execution_phase=4 if proposal_size > 1 else 3)

    def accept_dims(self, batch: int, accept_len: int) -> InferenceDims:
        """Draft catch-up over ``accept_len`` accepted tokens; one logits row per sequence (phase 4; 3 when
        one row wide)."""
        self._check_batch(batch)
        self._check_len("accept_len", accept_len, max(self.max_draft_tree_size, 1), "max_draft_tree_size")
        return self._dims(batch, accept_len, 1, accept_len, batch, execution_phase=4 if accept_len > 1 else 3)

    def reset_dims(self) -> InferenceDims:
        """Graph teardown: the smallest valid shapes (rope batch 1 even for MRoPE)."""
        return self._dims(1, 1, 1, 1, 1, rope_batch=1, execution_phase=1)


@dataclass(frozen=True)
class SpecDecodeConfig:
    """Speculative-decoding knobs shared by a base and its draft."""

    base_output_hidden_dim: int
    draft_hidden_size: int
    max_verify_size: int
    max_draft_proposal_size: int
    drafting_top_k: int = 1
    drafting_step: int = 1
    verify_size: int = 1

    def validate(self) -> SpecDecodeConfig:
        _positive(self, "base_output_hidden_dim", "draft_hidden_size", "max_verify_size",
                  "max_draft_proposal_size", "drafting_top_k", "drafting_step", "verify_size")
        if self.verify_size > self.max_verify_size:
            raise ConfigError("verify_size", f"{self.verify_size} exceeds max_verify_size ({self.max_verify_size})")
        if self.drafting_step * self.drafting_top_k > self.max_draft_proposal_size:
            raise ConfigError("drafting_step",
                              f"drafting_step * drafting_top_k = {self.drafting_step} * {self.drafting_top_k} "
                              f"exceeds max_draft_proposal_size ({self.max_draft_proposal_size})")
        return self

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, what: str = "SpecDecodeConfig") -> SpecDecodeConfig:
        return _from_mapping(cls, data, what).validate()


@dataclass(frozen=True)
class DeploymentConfig:
    """A base engine, optionally a draft, and the speculative-decoding config binding them."""

    base: LLMEngineConfig
    draft: LLMEngineConfig | None = None
    spec: SpecDecodeConfig | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def is_spec_decode(self) -> bool:
        return self.draft is not None

    def validate(self) -> DeploymentConfig:
        """Edge-LLM's bundle checks plus the consistency checks between the three parts."""
        self.base.validate()
        if (self.draft is None) != (self.spec is None):
            raise ConfigError("spec" if self.spec is None else "draft",
                              "a spec-decode deployment needs both a draft and a spec section")
        if self.draft is None:
            return self
        spec = self.spec
        assert spec is not None
        self.draft.validate()
        spec.validate()
        if not self.base.is_spec_decode_base:
            raise ConfigError("base.is_spec_decode_base", "must be true when a draft is given")
        if not self.draft.is_draft:
            raise ConfigError("draft.base_model_hidden_size", "must be positive for a draft engine")
        if self.draft.base_model_hidden_size != spec.base_output_hidden_dim:
            raise ConfigError("draft.base_model_hidden_size",
                              f"{self.draft.base_model_hidden_size} differs from spec.base_output_hidden_dim "
                              f"({spec.base_output_hidden_dim})")
        if self.draft.hidden_size != spec.draft_hidden_size:
            raise ConfigError("spec.draft_hidden_size",
                              f"{spec.draft_hidden_size} differs from draft.hidden_size ({self.draft.hidden_size})")
        if spec.verify_size > self.base.max_verify_tree_size:
            raise ConfigError("spec.verify_size", f"{spec.verify_size} exceeds base.max_verify_tree_size "
                                                  f"({self.base.max_verify_tree_size})")
        if spec.max_draft_proposal_size > self.draft.max_draft_tree_size:
            raise ConfigError("spec.max_draft_proposal_size",
                              f"{spec.max_draft_proposal_size} exceeds draft.max_draft_tree_size "
                              f"({self.draft.max_draft_tree_size})")
        if self.draft.activation_dtype != self.base.activation_dtype:
            raise ConfigError("draft.activation_dtype",
                              f"{self.draft.activation_dtype!r} differs from base.activation_dtype "
                              f"({self.base.activation_dtype!r}); the shared buffers have one dtype")
        return self

    def max_runtime_batch_size(self) -> int:
        """min(base, draft) max batch; warns when they differ."""
        if self.draft is None:
            return self.base.max_supported_batch_size
        b, d = self.base.max_supported_batch_size, self.draft.max_supported_batch_size
        if b != d:
            log.warning("base and draft max batch sizes differ (%d vs %d); using %d", b, d, min(b, d))
        return min(b, d)

    def effective_max_draft_proposal_size(self) -> int:
        """max(max_draft_proposal_size, verify_size): the tree size PipelineIO sizes for."""
        if self.spec is None:
            return 0
        return max(self.spec.max_draft_proposal_size, self.spec.verify_size)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"base": self.base.to_dict()}
        if self.draft is not None:
            out["draft"] = self.draft.to_dict()
        if self.spec is not None:
            out["spec"] = self.spec.to_dict()
        out.update(self.extra)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, what: str = "DeploymentConfig") -> DeploymentConfig:
        if not isinstance(data, Mapping) or "base" not in data:
            raise ConfigError(f"{what}.base", "is required")
        base = _from_mapping(LLMEngineConfig, data["base"], f"{what}.base")
        draft = _from_mapping(LLMEngineConfig, data["draft"], f"{what}.draft") if "draft" in data else None
        spec = _from_mapping(SpecDecodeConfig, data["spec"], f"{what}.spec") if "spec" in data else None
        extra = {k: v for k, v in data.items() if k not in ("base", "draft", "spec")}
        for key in extra:
            if key not in _DEPLOYMENT_EXTRA_KEYS:
                raise ConfigError(f"{what}.{key}", "is not a DeploymentConfig key; expected base, draft, spec"
                                                   f" or one of {_DEPLOYMENT_EXTRA_KEYS}")
        return cls(base, draft, spec, extra).validate()

    @classmethod
    def from_json(cls, path: str | os.PathLike[str]) -> DeploymentConfig:
        return cls.from_dict(_read_json(path), what=str(path))

    def to_json(self, path: str | os.PathLike[str]) -> None:
        _write_json(path, self.to_dict())


def read_config(path: str | os.PathLike[str]) -> LLMEngineConfig | DeploymentConfig:
    """A config JSON of either kind: a deployment (it has ``"base"``) or one engine's LLMEngineConfig."""
    data = _read_json(path)
    if isinstance(data, dict) and "base" in data:
        return DeploymentConfig.from_dict(data, what=str(path))
    return LLMEngineConfig.from_dict(data, what=str(path))
