"""Engine and deployment configs: frozen, validated once, JSON in and out, with the shape recipes.

Field names follow Edge-LLM's ``LLMEngineConfig`` / ``SpecDecodeConfig`` / ``DeploymentConfig`` in
snake_case. ``validate()`` raises :class:`ConfigError` naming the field and the value; configs read
from a file name the file too (``"path: field: message"``). Edge-LLM's own ``config.json`` files are
read by :meth:`LLMEngineConfig.from_edgellm` (the mapping lives in :mod:`trtio._edgellm_config`).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Iterator, Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import TYPE_CHECKING, Any

from trtio._checks import is_int
from trtio._dims import InferenceDims, StepShapes
from trtio._dtypes import DType
from trtio._edgellm_config import map_edgellm_config
from trtio._json import json_kind, read_json, write_json
from trtio._rope import RopeScaling, rope_parameters
from trtio.errors import ConfigError, InvalidTypeError, NotAvailableError
from trtio.features import F, FamilyConfig, family_configs, keyword_owner

__all__ = ["LLMEngineConfig", "SpecDecodeConfig", "DeploymentConfig", "read_config", "CONTRACTS", "FrozenMap",
           "KVLayerConfig", "LAYER_TYPES", "check_non_negative", "check_positive", "dtype_name", "freeze_json",
           "python_ints", "shown"]

log = logging.getLogger("trtio")

_ACTIVATION_DTYPES = ("float16", "bfloat16", "float32")
_KV_DTYPES = ("float16", "bfloat16", "float32", "fp8", "int8")
_ROPE_TYPES = ("rope", "mrope")
#: ``LLMEngineConfig.layer_types`` entries, as Edge-LLM's config writer spells them: an attention layer (KV pool),
#: or ``"mamba"`` for any recurrent layer (Gated DeltaNet or Mamba2: conv and recurrent state per slot).
LAYER_TYPES = ("attention", "mamba")
#: The engine I/O contracts a config may name: ``"batch"`` (batch-major activations, contiguous KV caches)
#: and ``"ragged"`` (Edge-LLM 0.11's token-major activations, paged KV pools; ``docs/edgellm-assumptions.md``
#: §3, §4); ``None`` means "as the engine declares" (``trtio.contract_of``).
CONTRACTS = ("batch", "ragged")
# Top-level keys a deployment JSON may carry besides base / draft / spec.
_DEPLOYMENT_EXTRA_KEYS = ("name", "description", "seed")


def _at(what: str, key: str) -> str:
    """The name of ``key`` inside ``what``: ``"path: key"`` for a file (``what`` ends with ":"),
    ``"what.key"`` for a section, ``key`` alone at the top."""
    if not what:
        return key
    return f"{what} {key}" if what.endswith(":") else f"{what}.{key}"


def _where(what: str) -> str:
    """``what`` standing alone (a file's ``"path:"`` without its colon)."""
    return what[:-1] if what.endswith(":") else what


def _within(what: str, exc: ConfigError) -> ConfigError:
    """``exc`` re-homed under ``what`` (the file or section it came from)."""
    return ConfigError(_at(what, exc.field), exc.message)


#: The largest size or count a config may give: step inputs and engine dimensions are 32-bit ints.
MAX_SIZE = 2**31 - 1


def shown(v: Any) -> str:
    """``repr(v)``, except for an int too long to show (Python refuses to print ints of over 4300 digits)."""
    if is_int(v) and abs(int(v)) > 10**30:
        return f"an int of {len(f'{abs(int(v)):x}') * 4} bits"
    return repr(v)


def check_positive(obj: Any, *names: str) -> None:
    """Each of ``obj``'s attributes ``names`` is an int in 1 .. 2**31 - 1 (ConfigError naming it)."""
    for name in names:
        v = getattr(obj, name)
        if not is_int(v) or v <= 0:
            raise ConfigError(name, f"must be a positive int, got {shown(v)}")
        _at_most_max(name, int(v))


def check_non_negative(obj: Any, *names: str) -> None:
    """Each of ``obj``'s attributes ``names`` is an int in 0 .. 2**31 - 1 (ConfigError naming it)."""
    for name in names:
        v = getattr(obj, name)
        if not is_int(v) or v < 0:
            raise ConfigError(name, f"must be a non-negative int, got {shown(v)}")
        _at_most_max(name, int(v))


def _at_most_max(name: str, v: int) -> None:
    if v > MAX_SIZE:
        raise ConfigError(name, f"must be at most 2**31 - 1 (trtio's step inputs are 32-bit ints), got {shown(v)}")


def python_ints(obj: Any) -> None:
    """Store every integer field (and the entries of a tuple of them) as a Python int: NumPy integers are
    accepted where a config takes a whole number, and kept as ``int`` so that JSON, hashing and equality
    see one type."""
    for f in fields(obj):
        v = getattr(obj, f.name)
        if is_int(v) and type(v) is not int:
            object.__setattr__(obj, f.name, int(v))
        elif isinstance(v, tuple) and any(is_int(x) and type(x) is not int for x in v):
            object.__setattr__(obj, f.name, tuple(int(x) if is_int(x) else x for x in v))


def _finite_floats(obj: Any) -> None:
    """Refuse NaN and infinities in every float field (a NaN rope_theta gives a NaN RoPE table)."""
    for f in fields(obj):
        v = getattr(obj, f.name)
        if isinstance(v, float) and not math.isfinite(v):
            raise ConfigError(f.name, f"must be a finite number, got {v!r}")


def dtype_name(value: Any) -> Any:
    """Normalise a dtype given as DType, numpy dtype, Edge-LLM short name or TensorRT name to trtio's
    name ("float16")."""
    try:
        return str(DType.coerce(value))
    except ValueError:
        return value  # validate() reports it with the field's name


class FrozenMap(Mapping[str, Any]):
    """A read-only mapping of JSON values (what ``LLMEngineConfig.extras`` holds): it compares equal to a
    dict with the same items, hashes, copies and pickles. Build one with :func:`freeze_json`."""

    __slots__ = ("_items",)
    _items: dict[str, Any]

    def __init__(self, items: Mapping[str, Any] | None = None) -> None:
        object.__setattr__(self, "_items", dict(items or {}))

    def __getitem__(self, key: str) -> Any:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __setattr__(self, name: str, value: Any) -> None:
        raise NotAvailableError(f"{type(self).__name__} is read-only")

    def __hash__(self) -> int:
        return hash(frozenset(self._items.items()))  # order-free, as equality is

    def __reduce__(self) -> tuple[Any, ...]:
        return (FrozenMap, (self._items,))

    def __repr__(self) -> str:
        return f"FrozenMap({self._items!r})"


def freeze_json(value: Any) -> Any:
    """A read-only deep copy of a JSON value: objects become :class:`FrozenMap`, lists tuples."""
    if isinstance(value, Mapping):
        return FrozenMap({str(k): freeze_json(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(freeze_json(v) for v in value)
    return value


def _thaw(value: Any) -> Any:
    """The plain JSON value (dicts and lists) of a :func:`freeze_json` result."""
    if isinstance(value, Mapping):
        return {k: _thaw(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [_thaw(v) for v in value]
    return value


_NO_EXTRAS: Mapping[str, Any] = FrozenMap()


def _from_mapping(cls: type, data: Mapping[str, Any], what: str) -> Any:
    if not isinstance(data, Mapping):
        raise ConfigError(_where(what) or cls.__name__, f"must be a JSON object, got a {json_kind(data)}")
    known = {f.name for f in fields(cls)} - {"features"}
    if cls is LLMEngineConfig:  # the families' keywords are its JSON keys too
        known |= {k for family in family_configs() for k in family.KEYWORDS}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(_at(what, unknown[0]), f"is not a {cls.__name__} field; known fields: {sorted(known)}")
    missing = [f.name for f in fields(cls)
               if f.name not in data and f.default is MISSING and f.default_factory is MISSING]
    if missing:
        raise ConfigError(_at(what, missing[0]), f"is required (a {cls.__name__} field with no default)")
    try:
        return cls(**data)
    except ConfigError as exc:
        raise _within(what, exc) from None


@dataclass(frozen=True)
class KVLayerConfig:
    """One attention layer's KV geometry (an entry of Edge-LLM's ``kv_layer_configs``)."""

    num_kv_heads: int
    head_dim: int

    def to_dict(self) -> dict[str, int]:
        return {"num_kv_heads": self.num_kv_heads, "head_dim": self.head_dim}


def _kv_layer(entry: Any) -> Any:
    """A ``kv_layer_configs`` entry as a KVLayerConfig (None stays None; anything else is left for validate())."""
    if isinstance(entry, Mapping) and set(entry) == {"num_kv_heads", "head_dim"}:
        return KVLayerConfig(entry["num_kv_heads"], entry["head_dim"])
    return entry


@dataclass(frozen=True, init=False)
class LLMEngineConfig:
    """What trtio needs to know about one LLM engine (base, draft or plain): the dense core, and the typed configs
    of the families the model uses (:attr:`features`, ``docs/architecture.md``, "Families and components").

    ``rotary_dim``, ``output_vocab_size`` and ``kv_pool_pages`` given as 0 (their default) resolve at
    construction to ``head_dim``, ``vocab_size`` and max batch x :attr:`pages_per_sequence`, so every
    reader sees the int the engine uses. ``rope_scaling`` given as a dict (HF's) is validated into a
    :class:`~trtio._rope.RopeScaling`. ``extras`` holds the Edge-LLM ``config.json`` keys trtio does not map
    onto a field (read-only, not compared). Build one from Edge-LLM's ``config.json``
    with :meth:`from_edgellm`.

    A family's fields (``recurrent_kind``, ``max_lora_rank``, ``eagle_hidden_state_layers``, ...: every registered
    family's keywords) are keywords of the constructor, of :func:`dataclasses.replace` and of the JSON layout, and
    read-only attributes; they are held by the family's typed config in :attr:`features`, which
    :meth:`feature` returns: ``cfg.feature(HybridConfig)`` is the one way to ask whether a family is there.
    """

    hidden_size: int
    vocab_size: int
    max_supported_batch_size: int
    max_supported_input_length: int
    max_kv_cache_capacity: int
    num_attention_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    rotary_dim: int = 0  # 0: head_dim (resolved at construction)
    output_vocab_size: int = 0  # 0: vocab_size (resolved at construction); a draft's logits width
    activation_dtype: str = "float16"
    kv_cache_dtype: str = "float16"
    num_deepstack_features: int = 0
    rope_type: str = "rope"
    rope_theta: float = 10000.0
    is_spec_decode_base: bool = False
    base_model_hidden_size: int = 0  # a draft's view of the base output width; 0 if not a draft
    max_verify_tree_size: int = 0  # spec-decode base: most tokens one verify step takes
    max_draft_tree_size: int = 0  # draft: most tokens one proposal / accept step takes
    contract: str | None = None  # "batch" | "ragged"; None: the engine's I/O decides (trtio.contract_of)
    kv_page_size: int = 128  # tokens per KV page (paged caches; Edge-LLM's is fixed at 128)
    kv_pool_pages: int = 0  # pages per paged KV pool; 0: max batch x pages_per_sequence (resolved at construction)
    rope_scaling: RopeScaling | None = None  # HF's rope_scaling (a dict is validated into a RopeScaling)
    max_position_embeddings: int = 0  # the model's; 0: unknown (dynamic / yarn / longrope scaling may need it)
    # The layer stack: the mixer layers in order, "attention" or another kind a family runs ("mamba": any recurrent
    # layer); () is every layer an attention layer. Nemotron-H lists its mixers only, not its MLP blocks.
    layer_types: tuple[str, ...] = ()
    kv_layer_configs: tuple[KVLayerConfig | None, ...] = ()  # per layer of layer_types: None where it has no KV
    use_rope: bool = True  # False: the attention layers rotate nothing (Nemotron-H); the RoPE input stays bound
    #: The typed configs of the families this model uses, in the family table's order (see the class docstring).
    features: tuple[FamilyConfig, ...] = ()
    extras: Mapping[str, Any] = field(default_factory=lambda: _NO_EXTRAS, compare=False, repr=False)

    def __init__(self, *args: Any, **values: Any) -> None:
        core, given = _split_keywords(args, values)
        for name, value in core.items():
            object.__setattr__(self, name, value)
        self.__post_init__()
        object.__setattr__(self, "features", _family_configs(given, self))

    def __post_init__(self) -> None:
        python_ints(self)
        # Resolved here, once, so that no reader ever sees a "derive me" value.
        if not self.output_vocab_size:
            object.__setattr__(self, "output_vocab_size", self.vocab_size)
        if not self.rotary_dim:
            object.__setattr__(self, "rotary_dim", self.head_dim)
        object.__setattr__(self, "activation_dtype", dtype_name(self.activation_dtype))
        object.__setattr__(self, "kv_cache_dtype", dtype_name(self.kv_cache_dtype))
        if (not self.kv_pool_pages and all(is_int(v) and v > 0 for v in (
                self.kv_page_size, self.max_supported_batch_size, self.max_kv_cache_capacity))):
            object.__setattr__(self, "kv_pool_pages", self.min_kv_pool_pages)
        scaling: Any = self.rope_scaling  # a dict from JSON, or a RopeScaling
        if isinstance(scaling, Mapping):
            object.__setattr__(self, "rope_scaling", RopeScaling.from_hf(scaling))
        types: Any = self.layer_types  # a list from JSON, or a tuple
        if isinstance(types, list):
            object.__setattr__(self, "layer_types", tuple(types))
        if isinstance(self.kv_layer_configs, (list, tuple)):
            object.__setattr__(self, "kv_layer_configs", tuple(_kv_layer(e) for e in self.kv_layer_configs))
        if isinstance(self.extras, Mapping) and not isinstance(self.extras, FrozenMap):
            object.__setattr__(self, "extras", freeze_json(self.extras))

    def __reduce__(self) -> tuple[Any, ...]:
        # Copies and pickles go through the JSON form, which every field value supports.
        return (_llm_config_from_fields, (self.to_dict(),))

    # -- families -----------------------------------------------------------------------------
    def feature(self, kind: type[F]) -> F | None:
        """The typed config of family ``kind`` (a :class:`~trtio.features.FamilyConfig` subclass, e.g.
        ``HybridConfig``) where this model uses that family, else None."""
        for found in self.features:
            if type(found) is kind:
                return found
        return None

    if not TYPE_CHECKING:  # the families' keywords, read as attributes (the public API; trtio asks feature())
        def __getattr__(self, name: str) -> Any:
            if name.startswith("__"):
                raise NotAvailableError(name)
            return _family_attribute(self, name)

    # -- step shapes (Edge-LLM's recipes: InferenceDims of each kind of step) -------------------
    @property
    def step_shapes(self) -> StepShapes:
        """The recipes of this config's steps (made once)."""
        found: StepShapes | None = self.__dict__.get("_step_shapes")
        if found is None:
            found = StepShapes(self.max_supported_batch_size, self.max_supported_input_length,
                               self.max_kv_cache_capacity, self.max_verify_tree_size, self.max_draft_tree_size,
                               self.rope_per_slot)
            object.__setattr__(self, "_step_shapes", found)
        return found

    @property
    def rope_gathers(self) -> tuple[tuple[str, str, int], ...]:
        """The RoPE rows the families gather per token beside the shared table's
        (:meth:`~trtio.features.FamilyConfig.rope_gathers`), found once."""
        found: tuple[tuple[str, str, int], ...] | None = self.__dict__.get("_rope_gathers")
        if found is None:
            found = tuple(g for family in self.features for g in family.rope_gathers(self))
            object.__setattr__(self, "_rope_gathers", found)
        return found

    def prefill_dims(self, batch: int, seq_len: int, kv_cache_empty: bool = True) -> InferenceDims:
        """:meth:`StepShapes.prefill_dims <trtio._dims.StepShapes.prefill_dims>` of this config."""
        return self.step_shapes.prefill_dims(batch, seq_len, kv_cache_empty)

    def decode_dims(self, batch: int) -> InferenceDims:
        """:meth:`StepShapes.decode_dims <trtio._dims.StepShapes.decode_dims>` of this config."""
        return self.step_shapes.decode_dims(batch)

    def spec_verify_dims(self, batch: int, verify_size: int) -> InferenceDims:
        """:meth:`StepShapes.spec_verify_dims <trtio._dims.StepShapes.spec_verify_dims>` of this config."""
        return self.step_shapes.spec_verify_dims(batch, verify_size)

    def proposal_dims(self, batch: int, proposal_size: int, top_k: int) -> InferenceDims:
        """:meth:`StepShapes.proposal_dims <trtio._dims.StepShapes.proposal_dims>` of this config."""
        return self.step_shapes.proposal_dims(batch, proposal_size, top_k)

    def accept_dims(self, batch: int, accept_len: int) -> InferenceDims:
        """:meth:`StepShapes.accept_dims <trtio._dims.StepShapes.accept_dims>` of this config."""
        return self.step_shapes.accept_dims(batch, accept_len)

    def reset_dims(self) -> InferenceDims:
        """:meth:`StepShapes.reset_dims <trtio._dims.StepShapes.reset_dims>` of this config."""
        return self.step_shapes.reset_dims()

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

    # -- the layer stack ------------------------------------------------------------------------
    @property
    def num_layers(self) -> int:
        """Mixer layers: ``len(layer_types)`` where the config lists them, else the attention layers."""
        return len(self.layer_types) or self.num_attention_layers

    @property
    def rope_per_slot(self) -> bool:
        """Whether each sequence slot has its own RoPE table (a family computes positions per sequence: MRoPE),
        rather than one table every engine of a setup shares (found once)."""
        found: bool | None = self.__dict__.get("_rope_per_slot")
        if found is None:
            found = any(family.rope_per_slot for family in self.features)
            object.__setattr__(self, "_rope_per_slot", found)
        return found

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

    @property
    def min_kv_pool_pages(self) -> int:
        """Pages a paged KV pool needs so that every sequence slot owns its pages: max batch x
        :attr:`pages_per_sequence` (Edge-LLM's "minimum active pages")."""
        return self.max_supported_batch_size * self.pages_per_sequence

    # -- validation ---------------------------------------------------------------------------
    def validate(self) -> LLMEngineConfig:
        """Check every field, the dense core's first, then each family's; raise ConfigError naming the first bad
        one. Returns self."""
        check_positive(self, "hidden_size", "vocab_size", "output_vocab_size", "max_supported_batch_size",
                       "max_supported_input_length", "max_kv_cache_capacity", "num_attention_layers",
                       "num_attention_heads", "num_kv_heads", "head_dim", "rotary_dim", "kv_page_size")
        check_non_negative(self, "num_deepstack_features", "base_model_hidden_size", "max_verify_tree_size",
                           "max_draft_tree_size", "kv_pool_pages", "max_position_embeddings")
        _finite_floats(self)
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
        theta = self.rope_theta
        if not isinstance(theta, (int, float)) or isinstance(theta, bool) or not math.isfinite(theta) or theta <= 0:
            raise ConfigError("rope_theta", f"must be a finite positive number, got {theta!r}")
        self._validate_rope_scaling()
        if not isinstance(self.is_spec_decode_base, bool):
            raise ConfigError("is_spec_decode_base", f"must be true or false, got {self.is_spec_decode_base!r}")
        if self.contract is not None and self.contract not in CONTRACTS:
            raise ConfigError("contract", f"must be null (the engine decides) or one of {list(CONTRACTS)}, "
                                          f"got {self.contract!r}")
        if self.max_kv_cache_capacity < self.max_supported_input_length:
            raise ConfigError("max_kv_cache_capacity",
                              f"{self.max_kv_cache_capacity} cannot hold max_supported_input_length "
                              f"({self.max_supported_input_length}) prompt tokens")
        if self.is_spec_decode_base and self.is_draft:
            raise ConfigError("base_model_hidden_size", "a spec-decode base cannot also be a draft (set it to 0)")
        if self.is_spec_decode_base and self.max_verify_tree_size <= 0:
            raise ConfigError("max_verify_tree_size",
                              f"a spec-decode base needs a positive value, got {self.max_verify_tree_size}")
        if self.is_draft and self.max_draft_tree_size <= 0:
            raise ConfigError("max_draft_tree_size", f"a draft needs a positive value, got {self.max_draft_tree_size}")
        if self.max_step_tokens > self.max_kv_cache_capacity:
            raise ConfigError("max_kv_cache_capacity", f"{self.max_kv_cache_capacity} is smaller than one step "
                                                       f"({self.max_step_tokens} tokens)")
        self._validate_layers()
        if not isinstance(self.extras, Mapping):
            raise ConfigError("extras", f"must be a JSON object, got {type(self.extras).__name__}")
        return self

    def _validate_rope_scaling(self) -> None:
        scaling = self.rope_scaling
        if scaling is None:
            return
        if not isinstance(scaling, RopeScaling):
            raise ConfigError("rope_scaling", f"must be a JSON object (HF's rope_scaling) or null, "
                                              f"got {type(scaling).__name__}")
        try:  # the scaling must fit this model: section sums, factor lengths, lengths it needs
            rope_parameters(self.rotary_dim, float(self.rope_theta), scaling,
                            max_position_embeddings=self.max_position_embeddings or None)
        except ConfigError as exc:
            field_name = {"theta": "rope_theta"}.get(exc.field, exc.field)
            raise ConfigError(field_name, exc.message) from None
        if scaling.rope_type == "dynamic" and scaling.alpha is None \
                and self.max_kv_cache_capacity > self.max_position_embeddings:
            # HF rescales the base only once a sequence passes max_position_embeddings (per length: no one table);
            # Edge-LLM's runtime refuses the table (llmRuntimeUtils.cpp::initializeRopeCosSinCache)
            raise ConfigError("max_kv_cache_capacity",
                              f"{self.max_kv_cache_capacity} is above max_position_embeddings "
                              f"({self.max_position_embeddings}) with rope_scaling.type 'dynamic' (NTK): Hugging Face "
                              f"rescales the RoPE base only for a sequence longer than max_position_embeddings, by "
                              f"its length, which one static table cannot follow, and Edge-LLM's runtime refuses "
                              f"such a table; expected max_kv_cache_capacity <= {self.max_position_embeddings} "
                              f"(build the engine with a KV capacity within it)")
        if scaling.rope_type == "longrope":
            self._validate_longrope(scaling)

    def _validate_longrope(self, scaling: RopeScaling) -> None:
        """LongRoPE as Edge-LLM's runtime builds it (``cpp/runtime/state/ropeCache.cpp``,
        ``llmRuntimeUtils.cpp::collectRopeConfig``): one static table, short factors where the KV capacity is within
        ``original_max_position_embeddings`` (read from the config's top level), else long factors for every
        position, cos and sin times ``sqrt(1 + ln(max / original) / ln(original))`` (``rope_scaling.factor`` and
        ``attention_factor`` unread). Where that is not Hugging Face's math, refused (``docs/edgellm-assumptions.md``
        5.2)."""
        original = scaling.original_max_position_embeddings
        assert original is not None
        top = self.extras.get("original_max_position_embeddings")
        if top is not None and top != original:
            raise ConfigError("original_max_position_embeddings",
                              f"is {top!r} but rope_scaling.original_max_position_embeddings is {original}: "
                              f"Edge-LLM's runtime switches LongRoPE's factors at the top-level one, Hugging Face "
                              f"at rope_scaling's")
        if self.max_kv_cache_capacity > original:
            raise ConfigError("max_kv_cache_capacity",
                              f"{self.max_kv_cache_capacity} is above rope_scaling.original_max_position_embeddings "
                              f"({original}) with rope_type 'longrope': Edge-LLM's runtime then rotates every "
                              f"position with long_factor, Hugging Face a sequence within {original} tokens with "
                              f"short_factor, so the two models' logits differ and trtio cannot be both; expected "
                              f"max_kv_cache_capacity <= {original} (build the engine with a KV capacity within "
                              f"it)")
        if not self.max_position_embeddings:
            return
        ratio = self.max_position_embeddings / original
        edge = math.sqrt(1 + math.log(ratio) / math.log(original)) if ratio > 1 and original > 1 else 1.0
        _, ours = rope_parameters(self.rotary_dim, float(self.rope_theta), scaling,
                                  max_position_embeddings=self.max_position_embeddings)
        if not math.isclose(ours, edge, rel_tol=1e-6):
            key = "attention_factor" if scaling.attention_factor is not None else "factor"
            raise ConfigError(f"rope_scaling.{key}",
                              f"gives LongRoPE an attention factor of {ours:.6g}; Edge-LLM's runtime reads neither "
                              f"rope_scaling.factor nor attention_factor and multiplies cos and sin by "
                              f"sqrt(1 + ln(max_position_embeddings / original) / ln(original)) = {edge:.6g}")

    def _validate_layers(self) -> None:
        """The layer stack: layer types, and the KV table (an entry per layer: the layer's KV geometry, or null for
        a layer without a KV cache)."""
        if not isinstance(self.use_rope, bool):
            raise ConfigError("use_rope", f"must be true or false, got {self.use_rope!r}")
        types = self.layer_types
        if not isinstance(types, tuple) or any(t not in LAYER_TYPES for t in types):
            raise ConfigError("layer_types", f"must be a list of {list(LAYER_TYPES)}, got {shown(types)}")
        if types and types.count("attention") != self.num_attention_layers:
            raise ConfigError("num_attention_layers", f"{self.num_attention_layers} differs from the "
                                                      f"{types.count('attention')} 'attention' entries of layer_types "
                                                      "(KV pools are numbered over attention layers only)")
        for family in self.features:  # the families' checks first: the KV table below asks them for its geometry
            family.validate(self)
        table = self.kv_layer_configs
        if not isinstance(table, tuple):
            raise ConfigError("kv_layer_configs", f"must be a list (one entry per layer), got {shown(table)}")
        if table and len(table) != len(types):
            raise ConfigError("kv_layer_configs", f"has {len(table)} entries for the {len(types)} layers of "
                                                  "layer_types")
        for i, entry in enumerate(table):
            kv_free = types[i] != "attention"
            if kv_free and entry is not None:
                raise ConfigError(f"kv_layer_configs[{i}]", f"layer {i} is recurrent ({types[i]!r}); its entry must be "
                                                            f"null, got {shown(entry)}")
            want = self.kv_geometry(i)
            if not kv_free and (not isinstance(entry, KVLayerConfig) or (entry.num_kv_heads, entry.head_dim) != want):
                raise ConfigError(f"kv_layer_configs[{i}]",
                                  f"attention layer {i} must have the model's KV geometry {{num_kv_heads: "
                                  f"{self.num_kv_heads}, head_dim: {self.head_dim}}} (per-layer KV head dims are not "
                                  f"supported), got {shown(entry)}")

    def kv_geometry(self, layer: int) -> tuple[int, int]:
        """``(num_kv_heads, head_dim)`` of attention layer ``layer``'s KV cache: a family's where one gives the
        layer its own (:meth:`~trtio.features.FamilyConfig.kv_geometry`), else the model's."""
        for family in self.features:
            found = family.kv_geometry(layer)
            if found is not None:
                return found
        return (self.num_kv_heads, self.head_dim)

    def draft_rows(self, top_k: int, step: int) -> int:
        """The token rows a draft step of this (draft) engine takes a sequence in a round of ``step`` levels of
        ``top_k`` candidates, the rows ``max_draft_tree_size`` bounds: a family's where one sizes its draft's steps
        (:meth:`~trtio.features.FamilyConfig.draft_rows`), else an EAGLE-style tree's ``top_k x step``."""
        for family in self.features:
            found = family.draft_rows(top_k, step)
            if found is not None:
                return found
        return top_k * step

    # -- JSON ---------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Every field as plain JSON values (``rope_scaling`` a dict or None, ``extras`` a dict), the families'
        keywords among them (each at its default where the model does not use the family);
        ``LLMEngineConfig.from_dict(cfg.to_dict()) == cfg``."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "features":
                continue
            if isinstance(value, RopeScaling):
                out[f.name] = value.to_dict()
            elif f.name == "kv_layer_configs":
                out[f.name] = [None if e is None else e.to_dict() if isinstance(e, KVLayerConfig) else e
                               for e in value]
            else:
                out[f.name] = _thaw(value)
        extras = out.pop("extras")
        for family in family_configs():
            present = self.feature(family)
            out.update({k: _thaw(v) for k, v in family.KEYWORDS.items()} if present is None else present.to_json())
        out["extras"] = extras
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, what: str = "LLMEngineConfig") -> LLMEngineConfig:
        """A validated config from trtio's own JSON layout (the field names). Errors name ``what``."""
        if isinstance(data, Mapping):
            data = {k: (0 if k in ("rotary_dim", "output_vocab_size") and v is None else v) for k, v in data.items()}
        cfg: LLMEngineConfig = _from_mapping(cls, data, what)
        try:
            return cfg.validate()
        except ConfigError as exc:
            raise _within(what, exc) from None

    @classmethod
    def from_json(cls, path: str | os.PathLike[str]) -> LLMEngineConfig:
        """A validated config from a JSON file in trtio's own layout (see :meth:`from_edgellm` for Edge-LLM's)."""
        return cls.from_dict(read_json(path), what=f"{path}:")

    def to_json(self, path: str | os.PathLike[str]) -> None:
        write_json(path, self.to_dict())

    @classmethod
    def from_edgellm(cls, source: str | os.PathLike[str] | Mapping[str, Any], *,
                     what: str | None = None) -> LLMEngineConfig:
        """A validated config from an Edge-LLM 0.11 engine config: a ``config.json`` /
        ``base_config.json`` / ``draft_config.json`` path, or its parsed dict.

        Maps Edge-LLM's keys onto trtio's fields (``num_hidden_layers`` -> ``num_attention_layers``,
        ``builder_config.max_batch_size`` -> ``max_supported_batch_size``, ...; the table is in
        :mod:`trtio._edgellm_config`, each family's keys in its typed config), sets ``contract="ragged"``, and keeps
        every key it does not map in ``extras``. Families trtio cannot bind yet are refused here, naming the key that
        marks them. ``what`` names a dict's source in errors (a path names itself). Errors name the file and the
        Edge-LLM key.
        """
        mapped = map_edgellm_config(source, what=what)
        try:
            return cls(**mapped.values).validate()
        except ConfigError as exc:
            raise mapped.error_for(exc) from None


_CORE_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(LLMEngineConfig))
_REQUIRED = tuple(f.name for f in fields(LLMEngineConfig)
                  if f.default is MISSING and f.default_factory is MISSING)
_DEFAULTS = {f.name: (f.default_factory() if f.default_factory is not MISSING else f.default)
             for f in fields(LLMEngineConfig) if f.name not in _REQUIRED}


def _split_keywords(args: tuple[Any, ...], values: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """An LLMEngineConfig's constructor arguments as (every core field's value, the families' keywords given):
    positional ones in field order, as the dataclass's own constructor takes them."""
    if len(args) > len(_CORE_FIELDS):
        raise InvalidTypeError(f"LLMEngineConfig() takes at most {len(_CORE_FIELDS)} positional arguments, got "
                               f"{len(args)}")
    for name, value in zip(_CORE_FIELDS, args):
        if name in values:
            raise InvalidTypeError(f"LLMEngineConfig() got multiple values for argument {name!r}")
        values[name] = value
    core = dict(_DEFAULTS)
    given: dict[str, Any] = {}
    for name, value in values.items():
        if name in core or name in _REQUIRED:
            core[name] = value
        elif keyword_owner(name) is not None:
            given[name] = value
        else:
            raise InvalidTypeError(f"LLMEngineConfig() got an unexpected keyword argument {name!r}")
    missing = [n for n in _REQUIRED if n not in values]
    if missing:
        raise InvalidTypeError(f"LLMEngineConfig() missing required argument(s): {', '.join(map(repr, missing))}")
    if core["extras"] is _DEFAULTS["extras"]:
        core["extras"] = _NO_EXTRAS
    return core, given


def _family_configs(given: Mapping[str, Any], cfg: LLMEngineConfig) -> tuple[FamilyConfig, ...]:
    """The typed configs of ``cfg``: each registered family's, from its keywords (those of a typed config already in
    ``cfg.features``, then those ``given``, each at its default where neither has it) and the dense core."""
    core = {name: getattr(cfg, name) for name in _CORE_FIELDS if name != "features"}
    held = cfg.features
    if not isinstance(held, tuple) or not all(isinstance(f, FamilyConfig) for f in held):
        raise ConfigError("features", f"must be a tuple of families' typed configs, got {shown(held)}")
    out = []
    for family in family_configs():
        keywords = dict(family.KEYWORDS)
        for found in held:
            if type(found) is family:
                keywords.update(found.keywords())
        keywords.update((k, tuple(v) if isinstance(v, list) else v) for k, v in given.items() if k in family.KEYWORDS)
        made = family.from_keywords(keywords, core)
        if made is not None:
            out.append(made)
    strays = [f for f in held if type(f) not in family_configs()]
    if strays:
        raise ConfigError("features", f"{type(strays[0]).__name__} is no registered family's typed config")
    return tuple(out)


def _family_attribute(cfg: LLMEngineConfig, name: str) -> Any:
    """A family's keyword (or another attribute its typed config offers, e.g. ``is_hybrid``) read on ``cfg``: the
    family's value where the model uses it, its default (or its absent value) where not."""
    owner = keyword_owner(name)
    if owner is not None:
        found = cfg.feature(owner)
        return getattr(found, name) if found is not None else owner.KEYWORDS[name]
    for family in family_configs():
        alias = family.ALIASES.get(name)
        if alias is not None:
            return alias(cfg, cfg.feature(family))
    raise NotAvailableError(f"{type(cfg).__name__!r} object has no attribute {name!r}")


def _llm_config_from_fields(data: dict[str, Any]) -> LLMEngineConfig:
    return LLMEngineConfig(**data)


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

    def __post_init__(self) -> None:
        python_ints(self)

    def validate(self, draft_rows: int | None = None) -> SpecDecodeConfig:
        """Check the knobs; ``draft_rows``: the rows a draft step of a round takes (the draft's
        :meth:`LLMEngineConfig.draft_rows`; default an EAGLE-style tree's ``drafting_step * drafting_top_k``),
        bounded by ``max_draft_proposal_size``."""
        check_positive(self, "base_output_hidden_dim", "draft_hidden_size", "max_verify_size",
                  "max_draft_proposal_size", "drafting_top_k", "drafting_step", "verify_size")
        if self.verify_size > self.max_verify_size:
            raise ConfigError("verify_size", f"{self.verify_size} exceeds max_verify_size ({self.max_verify_size})")
        tree = self.drafting_step * self.drafting_top_k
        rows = tree if draft_rows is None else draft_rows
        if rows > self.max_draft_proposal_size and rows == tree:
            raise ConfigError("drafting_step",
                              f"drafting_step * drafting_top_k = {self.drafting_step} * {self.drafting_top_k} "
                              f"exceeds max_draft_proposal_size ({self.max_draft_proposal_size})")
        if rows > self.max_draft_proposal_size:
            raise ConfigError("drafting_step",
                              f"a round of drafting_step {self.drafting_step} x drafting_top_k {self.drafting_top_k} "
                              f"takes {rows} rows a draft step, more than max_draft_proposal_size "
                              f"({self.max_draft_proposal_size})")
        return self

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, what: str = "SpecDecodeConfig",
                  draft: LLMEngineConfig | None = None) -> SpecDecodeConfig:
        """A validated spec section (``draft``: its draft's config, which sizes a round's draft steps)."""
        spec: SpecDecodeConfig = _from_mapping(cls, data, what)
        try:
            return spec.validate(None if draft is None else draft.draft_rows(spec.drafting_top_k, spec.drafting_step))
        except ConfigError as exc:
            raise _within(what, exc) from None


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
        spec.validate(self.draft.draft_rows(spec.drafting_top_k, spec.drafting_step))
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
        if None not in (self.base.contract, self.draft.contract) and self.draft.contract != self.base.contract:
            raise ConfigError("draft.contract", f"{self.draft.contract!r} differs from base.contract "
                                                f"({self.base.contract!r}); a base and its draft speak one engine "
                                                "I/O contract")
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
        """A validated deployment from trtio's JSON layout: ``base`` (required), ``draft`` and ``spec``
        (together), and optionally ``name`` / ``description`` / ``seed``. Errors name ``what``."""
        if not isinstance(data, Mapping):
            raise ConfigError(_where(what) or "DeploymentConfig",
                              f"must hold a JSON object with a \"base\" section, got a {json_kind(data)}")
        if "base" not in data:
            raise ConfigError(_at(what, "base"), "is required (the base or plain LLM engine's config)")
        extra = {k: v for k, v in data.items() if k not in ("base", "draft", "spec")}
        for key in extra:
            if key not in _DEPLOYMENT_EXTRA_KEYS:
                raise ConfigError(_at(what, key), "is not a DeploymentConfig key; expected base, draft, spec"
                                                  f" or one of {_DEPLOYMENT_EXTRA_KEYS}")
        base = LLMEngineConfig.from_dict(data["base"], what=_at(what, "base"))
        draft = LLMEngineConfig.from_dict(data["draft"], what=_at(what, "draft")) if "draft" in data else None
        spec = SpecDecodeConfig.from_dict(data["spec"], what=_at(what, "spec"), draft=draft) if "spec" in data else None
        try:
            return cls(base, draft, spec, extra).validate()
        except ConfigError as exc:
            raise _within(what, exc) from None

    @classmethod
    def from_json(cls, path: str | os.PathLike[str]) -> DeploymentConfig:
        """A validated deployment from a JSON file in trtio's layout. An Edge-LLM engine directory has no
        deployment file: use ``trtio.edgellm.EngineDir.open(path).deployment(...)``."""
        return cls.from_dict(read_json(path), what=f"{path}:")

    def to_json(self, path: str | os.PathLike[str]) -> None:
        write_json(path, self.to_dict())


def read_config(path: str | os.PathLike[str]) -> LLMEngineConfig | DeploymentConfig:
    """A config JSON of either kind: a deployment (it has ``"base"``) or one engine's LLMEngineConfig."""
    data = read_json(path)
    if isinstance(data, dict) and "base" in data:
        return DeploymentConfig.from_dict(data, what=f"{path}:")
    return LLMEngineConfig.from_dict(data, what=f"{path}:")
