"""RoPE cos/sin tables in Edge-LLM's layout, with Hugging Face transformers' rope scaling types.

Each position row is ``[cos(angle_0 .. angle_{R/2-1}) | sin(angle_0 .. angle_{R/2-1})] * attention_factor``
with ``angle_i = position * inv_freq_i``. :class:`RopeScaling` is a validated ``rope_scaling`` (HF's
``rope_parameters``) dict; :func:`rope_parameters` turns it into ``inv_freq`` and the attention factor the
way ``transformers.modeling_rope_utils`` defines each ``rope_type``. Everything here is computed in
float64 on the host and rounded to float32 once.
"""

from __future__ import annotations

import copy
import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any

import numpy as np

from trtio._checks import check_int, is_int
from trtio.errors import ConfigError, ShapeError

__all__ = ["NEUTRAL_KEYS", "ROPE_TYPES", "RopeScaling", "mrope_cos_sin_rows", "no_rope_cos_sin_rows",
           "proportional_rope_parameters", "rope_cos_sin_rows", "rope_cos_sin_table", "rope_parameters"]

#: The ``rope_type`` values :class:`RopeScaling` accepts. ``"mrope"`` is the legacy Qwen2-VL spelling:
#: default frequencies, with ``mrope_section`` saying which position axis each frequency follows.
ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn", "longrope", "mrope")

# The keys each rope_type reads (besides rope_type and the mrope keys, which any type may carry).
# A key that is in the dict but not in its type's list is kept in ``extras``.
_REQUIRED: dict[str, tuple[str, ...]] = {
    "default": (),
    "mrope": ("mrope_section",),
    "linear": ("factor",),
    "dynamic": ("factor",),
    "llama3": ("factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor"),
    "yarn": ("factor", "original_max_position_embeddings"),
    "longrope": ("short_factor", "long_factor", "original_max_position_embeddings"),
}
_OPTIONAL: dict[str, tuple[str, ...]] = {
    "default": (),
    "mrope": (),
    "linear": (),
    "dynamic": ("alpha",),
    "llama3": (),
    "yarn": ("attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "truncate"),
    "longrope": ("factor", "attention_factor"),
}
_MROPE_KEYS = ("mrope_section", "mrope_interleaved")
#: Keys a ``rope_scaling`` dict may carry that no rope type reads for its frequencies: the legacy ``type`` beside
#: ``rope_type``, and the copies of the config's own ``rope_theta`` and ``partial_rotary_factor`` that
#: transformers 5 and Edge-LLM's writer put there (the caller checks them against the config's).
NEUTRAL_KEYS = ("type", "rope_theta", "partial_rotary_factor")
# Every key some rope type reads: a key of another type is ignored by this one, as transformers ignores it
# (HunYuan's "dynamic" scaling with ``alpha`` carries YaRN's beta_fast, mscale, ... besides); a key no type reads
# is refused, naming it, rather than ignored.
_KNOWN_KEYS = frozenset(k for keys in (*_REQUIRED.values(), *_OPTIONAL.values()) for k in keys) | set(_MROPE_KEYS)
# HF's yarn defaults (modeling_rope_utils._compute_yarn_parameters).
_YARN_DEFAULTS: dict[str, Any] = {"beta_fast": 32.0, "beta_slow": 1.0, "truncate": True}


def _is_number(v: Any) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_))


def _check_number(name: str, v: Any, *, low: float, inclusive: bool = True) -> float:
    """``v`` as a float, or ConfigError naming ``name`` if it is not a finite number in range."""
    relation = ">=" if inclusive else ">"
    if not _is_number(v) or not math.isfinite(v):
        raise ConfigError(name, f"expected a finite number {relation} {low:g}, got {v!r}")
    if v < low or (not inclusive and v == low):
        raise ConfigError(name, f"expected a number {relation} {low:g}, got {v!r}")
    return float(v)


def _check_bool(name: str, v: Any) -> bool:
    if not isinstance(v, bool):
        raise ConfigError(name, f"expected true or false, got {v!r}")
    return v


def _check_factors(name: str, v: Any) -> tuple[float, ...]:
    if isinstance(v, (str, bytes)) or not isinstance(v, Sequence) or len(v) == 0:
        raise ConfigError(name, f"expected a non-empty list of numbers, got {v!r}")
    for i, x in enumerate(v):
        if not _is_number(x) or not math.isfinite(x) or x <= 0:
            raise ConfigError(name, f"expected finite numbers > 0, got {x!r} at index {i}")
    return tuple(float(x) for x in v)


def _check_section(name: str, v: Any) -> tuple[int, ...]:
    if isinstance(v, (str, bytes)) or not isinstance(v, Sequence) or len(v) != 3:
        raise ConfigError(name, f"expected 3 ints (temporal, height, width frequency counts), got {v!r}")
    for x in v:
        if not is_int(x) or x < 0:
            raise ConfigError(name, f"expected 3 ints >= 0, got {v!r}")
    return tuple(int(x) for x in v)


@dataclass(frozen=True)
class RopeScaling:
    """A validated ``rope_scaling`` (HF's normalized ``rope_parameters``: key ``"rope_type"`` or legacy ``"type"``).

    Field names are HF's keys. ``None`` means the key was not given: for ``yarn`` and ``longrope`` a
    missing ``factor`` is ``max_position_embeddings / original_max_position_embeddings``, and a missing
    ``attention_factor`` is derived as HF derives it. ``yarn``'s ``beta_fast``, ``beta_slow`` and
    ``truncate`` are filled with HF's defaults (32, 1, true). ``mrope_section`` and ``mrope_interleaved``
    (Qwen2-VL / Qwen3-VL) may accompany any type. ``dynamic`` with ``alpha`` is HunYuan's DynamicNTKAlpha
    (a static base ``theta * alpha ** (R / (R - 2))``; ``factor`` is then not needed, and ignored where given,
    as transformers' HunYuan model ignores it). ``extras`` keeps the keys the type does not read
    (:data:`NEUTRAL_KEYS`, another type's keys, which transformers ignores too): ``rope_theta`` and the rotary
    dimension are passed to :func:`rope_parameters` by the caller, never taken from here. A key no rope type
    reads is refused (:class:`ConfigError` naming it): it would change the model's math in a way trtio does not
    know.
    ``what`` is the config path used in error messages.

    Construct with :meth:`from_hf`; direct construction is validated the same way.
    """

    rope_type: str
    factor: float | None = None
    original_max_position_embeddings: int | None = None
    low_freq_factor: float | None = None
    high_freq_factor: float | None = None
    beta_fast: float | None = None
    beta_slow: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None
    attention_factor: float | None = None
    alpha: float | None = None  # dynamic: HunYuan's NTK alpha (a static rescaled base)
    truncate: bool | None = None
    short_factor: tuple[float, ...] | None = None
    long_factor: tuple[float, ...] | None = None
    mrope_section: tuple[int, ...] | None = None
    mrope_interleaved: bool = False
    extras: Mapping[str, Any] = field(default_factory=dict, hash=False)
    what: str = field(default="rope_scaling", compare=False, repr=False)

    def __post_init__(self) -> None:
        t = self.rope_type
        if t not in ROPE_TYPES:
            raise ConfigError(f"{self.what}.rope_type", f"expected one of {list(ROPE_TYPES)}, got {t!r}")
        used = set(_REQUIRED[t]) | set(_OPTIONAL[t]) | set(_MROPE_KEYS)
        for f in fields(self):
            if f.name in ("rope_type", "extras", "what", "mrope_interleaved") or f.name in used:
                continue
            if getattr(self, f.name) is not None:
                raise ConfigError(self._key(f.name), f"is not used by rope_type {t!r}; leave it unset")
        if t == "yarn":
            for name, default in _YARN_DEFAULTS.items():
                if getattr(self, name) is None:
                    self._set(name, default)
        for name in _REQUIRED[t]:
            if getattr(self, name) is None and not (name == "factor" and (t == "yarn" or self.alpha is not None)):
                raise ConfigError(self._key(name), f"is required for rope_type {t!r}")
        self._normalize()
        self._check_relations()

    def _key(self, name: str) -> str:
        return f"{self.what}.{name}"

    def _set(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)

    def _normalize(self) -> None:
        """Check each given field's type and range, and store it in its canonical type."""
        if self.factor is not None:
            self._set("factor", _check_number(self._key("factor"), self.factor, low=1.0))
        for name in ("low_freq_factor", "high_freq_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim",
                     "attention_factor", "alpha"):
            v = getattr(self, name)
            if v is not None:
                self._set(name, _check_number(self._key(name), v, low=0.0, inclusive=False))
        if self.original_max_position_embeddings is not None:
            key = self._key("original_max_position_embeddings")
            self._set("original_max_position_embeddings",
                      check_int(self.original_max_position_embeddings, key, minimum=1, error=ConfigError))
        if self.truncate is not None:
            _check_bool(self._key("truncate"), self.truncate)
        for name in ("short_factor", "long_factor"):
            v = getattr(self, name)
            if v is not None:
                self._set(name, _check_factors(self._key(name), v))
        if self.mrope_section is not None:
            self._set("mrope_section", _check_section(self._key("mrope_section"), self.mrope_section))
        _check_bool(self._key("mrope_interleaved"), self.mrope_interleaved)
        if not isinstance(self.extras, Mapping):
            raise ConfigError(self._key("extras"), f"expected a mapping, got {type(self.extras).__name__}")
        read = set(_REQUIRED[self.rope_type]) | set(_OPTIONAL[self.rope_type]) | set(_MROPE_KEYS) | {"rope_type"}
        clash = sorted(set(self.extras) & read)
        if clash:
            raise ConfigError(self._key(clash[0]),
                              f"is read by rope_type {self.rope_type!r}; pass it as a field, not in extras")
        unknown = sorted(str(k) for k in self.extras if k not in _KNOWN_KEYS and k not in NEUTRAL_KEYS)
        if unknown:
            raise ConfigError(self._key(unknown[0]),
                              f"is not a RoPE scaling parameter trtio knows (rope types {list(ROPE_TYPES)} read "
                              f"{sorted(_KNOWN_KEYS)}; {list(NEUTRAL_KEYS)} are accepted beside them); the "
                              "config is refused rather than its RoPE table computed without it")
        self._set("extras", MappingProxyType(copy.deepcopy(dict(self.extras))))

    def _check_relations(self) -> None:
        if self.rope_type == "llama3":
            assert self.low_freq_factor is not None and self.high_freq_factor is not None
            if self.high_freq_factor <= self.low_freq_factor:
                raise ConfigError(self._key("high_freq_factor"),
                                  f"expected a number > low_freq_factor ({self.low_freq_factor:g}), "
                                  f"got {self.high_freq_factor:g}")
        if self.rope_type == "yarn":
            assert self.beta_fast is not None and self.beta_slow is not None
            if self.beta_fast < self.beta_slow:
                raise ConfigError(self._key("beta_fast"),
                                  f"expected a number >= beta_slow ({self.beta_slow:g}), got {self.beta_fast:g}")
        if self.rope_type == "longrope":
            assert self.short_factor is not None and self.long_factor is not None
            if len(self.short_factor) != len(self.long_factor):
                raise ConfigError(self._key("long_factor"),
                                  f"expected as many numbers as short_factor ({len(self.short_factor)}), "
                                  f"got {len(self.long_factor)}")
        if self.mrope_interleaved and self.mrope_section is None:
            raise ConfigError(self._key("mrope_section"), "is required when mrope_interleaved is true")

    @classmethod
    def from_hf(cls, data: Mapping[str, Any] | None, *, what: str = "rope_scaling") -> RopeScaling | None:
        """Validate HF's ``rope_scaling`` / ``rope_parameters`` dict; ``None`` or ``{}`` gives ``None``.

        ``rope_type`` wins over the legacy ``type`` when both are present (as in HF); a dict with
        neither is ``"default"``. Raises :class:`ConfigError` naming ``f"{what}.{key}"`` for an unknown
        rope type, a missing required key, a value of the wrong type, or a non-finite or out-of-range number.
        """
        if data is None:
            return None
        if not isinstance(data, Mapping):
            raise ConfigError(what, f"expected a mapping (HF's rope_scaling dict) or None, got {type(data).__name__}")
        if not data:
            return None
        rest = dict(data)
        if "rope_type" in rest:
            rope_type = rest.pop("rope_type")
        else:
            rope_type = rest.pop("type", "default")
        if not isinstance(rope_type, str) or rope_type not in ROPE_TYPES:
            key = "rope_type" if "rope_type" in data else "type"
            raise ConfigError(f"{what}.{key}", f"expected one of {list(ROPE_TYPES)}, got {rope_type!r}")
        if "alpha" in rest and rest["alpha"] is None:
            del rest["alpha"]  # null: no alpha, as transformers reads it
        if "interleaved" in rest:  # Qwen3-ASR's / Qwen3-Omni's hub spelling of mrope_interleaved
            alias = rest.pop("interleaved")
            if rest.setdefault("mrope_interleaved", alias) != alias:
                raise ConfigError(f"{what}.interleaved", f"is {alias!r} but mrope_interleaved is "
                                                         f"{rest['mrope_interleaved']!r} (the same key, spelled twice)")
        for key in _REQUIRED[rope_type]:
            if key not in rest and not (key == "factor" and rope_type == "dynamic" and "alpha" in rest):
                raise ConfigError(f"{what}.{key}", f"is required for rope_type {rope_type!r} and is missing")
        read = set(_REQUIRED[rope_type]) | set(_OPTIONAL[rope_type]) | set(_MROPE_KEYS)
        kwargs = {key: rest.pop(key) for key in list(rest) if key in read}
        return cls(rope_type=rope_type, **kwargs, extras=rest, what=what)

    def to_dict(self) -> dict[str, Any]:
        """HF's dict for this scaling: ``rope_type``, the fields that are set, then ``extras``.

        ``RopeScaling.from_hf(s.to_dict()) == s``.
        """
        out: dict[str, Any] = {"rope_type": self.rope_type}
        for f in fields(self):
            if f.name in ("rope_type", "extras", "what", "mrope_interleaved"):
                continue
            v = getattr(self, f.name)
            if v is None and not (f.name == "factor" and self.rope_type == "yarn"):
                continue
            out[f.name] = list(v) if isinstance(v, tuple) else v
        if self.mrope_section is not None:
            out["mrope_interleaved"] = self.mrope_interleaved
        out.update(copy.deepcopy(dict(self.extras)))
        return out


def _check_rotary_dim(rotary_dim: Any) -> int:
    if not is_int(rotary_dim) or rotary_dim <= 0 or rotary_dim % 2:
        raise ConfigError("rotary_dim", f"expected a positive even int, got {rotary_dim!r}")
    return int(rotary_dim)


def _needs_max_positions(max_position_embeddings: int | None, why: str) -> int:
    if max_position_embeddings is None:
        raise ConfigError("max_position_embeddings", f"is required {why}")
    return check_int(max_position_embeddings, "max_position_embeddings", minimum=1, error=ConfigError)


def _yarn(rotary_dim: int, theta: float, s: RopeScaling, factor: float, base_inv: np.ndarray) -> np.ndarray:
    """YaRN: interpolate (divide by factor) the long wavelengths, keep the short ones, ramp in between.

    The ramp runs over frequency index between the dimensions where a wavelength fits beta_fast and
    beta_slow turns into the original context (HF's find_correction_range, floor/ceil when truncate).
    """
    assert s.original_max_position_embeddings is not None and s.beta_fast is not None and s.beta_slow is not None
    original = s.original_max_position_embeddings

    def correction_dim(rotations: float) -> float:
        return rotary_dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(s.beta_fast), correction_dim(s.beta_slow)
    if s.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, rotary_dim - 1)
    if low == high:
        high += 0.001  # HF's guard against a zero-width ramp
    ramp = np.clip((np.arange(rotary_dim // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)
    interpolated = base_inv / factor
    result: np.ndarray = interpolated * ramp + base_inv * (1.0 - ramp)
    return result


def _yarn_attention(s: RopeScaling, factor: float) -> float:
    if s.attention_factor is not None:
        return s.attention_factor

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if s.mscale is not None and s.mscale_all_dim is not None:
        return mscale(factor, s.mscale) / mscale(factor, s.mscale_all_dim)
    return mscale(factor)


def _llama3(s: RopeScaling, base_inv: np.ndarray) -> np.ndarray:
    """Llama 3.1: keep wavelengths below original/high_freq_factor, divide those above
    original/low_freq_factor by factor, and blend linearly in 1/wavelength between."""
    assert s.factor is not None and s.original_max_position_embeddings is not None
    assert s.low_freq_factor is not None and s.high_freq_factor is not None
    original = s.original_max_position_embeddings
    wavelen = 2 * math.pi / base_inv
    smooth = (original / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    blended = (1 - smooth) * base_inv / s.factor + smooth * base_inv
    result: np.ndarray = np.where(wavelen > original / s.low_freq_factor, base_inv / s.factor,
                                  np.where(wavelen < original / s.high_freq_factor, base_inv, blended))
    return result


def rope_parameters(rotary_dim: int, theta: float, scaling: RopeScaling | None = None, *,
                    max_position_embeddings: int | None = None,
                    seq_len: int | None = None) -> tuple[np.ndarray, float]:
    """``(inv_freq, attention_factor)``: float64 ``[rotary_dim / 2]`` and the factor HF multiplies cos and sin by.

    Follows ``transformers.modeling_rope_utils`` for ``scaling.rope_type``. ``rotary_dim`` is the
    rotated width (``head_dim * partial_rotary_factor``); ``theta`` is ``rope_theta``.
    ``max_position_embeddings`` is the model config's: ``dynamic`` needs it (the length it scales
    beyond), and ``yarn`` / ``longrope`` without ``factor`` derive the factor from it. ``seq_len`` is the
    length of the sequence being encoded, which ``dynamic`` (rescales the base beyond
    ``max_position_embeddings``) and ``longrope`` (``long_factor`` beyond ``original_max_position_embeddings``)
    depend on; ``None`` gives HF's result at model init (no dynamic scaling, longrope's short factors).
    """
    rotary_dim = _check_rotary_dim(rotary_dim)
    if not _is_number(theta) or not math.isfinite(theta) or theta <= 0:
        raise ConfigError("theta", f"expected a finite number > 0 (rope_theta), got {theta!r}")
    theta = float(theta)
    if max_position_embeddings is not None:
        check_int(max_position_embeddings, "max_position_embeddings", minimum=1, error=ConfigError)
    if seq_len is not None:
        check_int(seq_len, "seq_len", minimum=0, error=ConfigError)
    half = rotary_dim // 2
    # Same expression as the unscaled table always used, so that table stays bit-identical.
    base_inv: np.ndarray = theta ** (-np.arange(half, dtype=np.float64) * 2.0 / rotary_dim)
    if scaling is None:
        return base_inv, 1.0
    s = scaling
    t = s.rope_type
    if s.mrope_section is not None and sum(s.mrope_section) != half:
        raise ConfigError(s._key("mrope_section"),
                          f"expected counts summing to rotary_dim / 2 = {half}, got {list(s.mrope_section)} "
                          f"(sum {sum(s.mrope_section)})")
    if t in ("default", "mrope"):
        return base_inv, 1.0
    if t == "linear":
        assert s.factor is not None
        return base_inv / s.factor, 1.0
    if t == "dynamic" and s.alpha is not None:
        # HunYuan's DynamicNTKAlpha (transformers' HunYuanDenseV1RotaryEmbedding, "ntk_alpha"): a fixed alpha
        # rescales the base once, whatever the sequence length.
        if rotary_dim == 2:
            raise ConfigError("rotary_dim", "expected > 2 for rope_type 'dynamic' with alpha (its base exponent is "
                                            "R / (R - 2))")
        alpha_base = theta * s.alpha ** (rotary_dim / (rotary_dim - 2))
        alpha_inv: np.ndarray = alpha_base ** (-np.arange(half, dtype=np.float64) * 2.0 / rotary_dim)
        return alpha_inv, 1.0
    if t == "dynamic":
        assert s.factor is not None
        max_pos = _needs_max_positions(max_position_embeddings, "for rope_type 'dynamic' (the length it scales beyond)")
        if rotary_dim == 2:
            raise ConfigError("rotary_dim", "expected > 2 for rope_type 'dynamic' (its base exponent is R / (R - 2))")
        length = max(seq_len or max_pos, max_pos)
        base = theta * (s.factor * length / max_pos - (s.factor - 1)) ** (rotary_dim / (rotary_dim - 2))
        dynamic_inv: np.ndarray = base ** (-np.arange(half, dtype=np.float64) * 2.0 / rotary_dim)
        return dynamic_inv, 1.0
    if t == "llama3":
        return _llama3(s, base_inv), 1.0
    assert s.original_max_position_embeddings is not None
    original = s.original_max_position_embeddings
    factor = s.factor
    if factor is None:
        why = f"for rope_type {t!r} without {s._key('factor')} (factor = max_position_embeddings / original)"
        factor = _needs_max_positions(max_position_embeddings, why) / original
    if t == "yarn":
        if theta <= 1:
            raise ConfigError("theta", f"expected a number > 1 for rope_type 'yarn' (it divides by ln theta), "
                                       f"got {theta!r}")
        return _yarn(rotary_dim, theta, s, factor, base_inv), _yarn_attention(s, factor)
    # longrope
    assert s.short_factor is not None and s.long_factor is not None
    for name, values in (("short_factor", s.short_factor), ("long_factor", s.long_factor)):
        if len(values) != half:
            raise ConfigError(s._key(name), f"expected {half} numbers (rotary_dim {rotary_dim} / 2), got {len(values)}")
    ext = s.long_factor if seq_len and seq_len > original else s.short_factor
    attention = s.attention_factor
    if attention is None:
        if factor <= 1.0:
            attention = 1.0
        elif original == 1:
            raise ConfigError(s._key("original_max_position_embeddings"),
                              "expected > 1 to derive longrope's attention factor (it divides by its log)")
        else:
            attention = math.sqrt(1 + math.log(factor) / math.log(original))
    longrope_inv: np.ndarray = base_inv / np.asarray(ext, dtype=np.float64)
    return longrope_inv, attention


def proportional_rope_parameters(head_dim: int, theta: float, partial_rotary_factor: float,
                                 factor: float = 1.0) -> np.ndarray:
    """float64 ``[head_dim / 2]``: Gemma 4's ``"proportional"`` RoPE (transformers'
    ``_compute_proportional_rope_parameters``). The first ``int(partial_rotary_factor * head_dim / 2)``
    frequencies are ``theta ** (-2i / head_dim)`` (the exponent over the whole head, not over the rotated part,
    which is what sets it apart from a partial rotary of ``rope_parameters``); the rest are 0, so those dims are
    not rotated (cos 1, sin 0). Every frequency is divided by ``factor``. The table is ``head_dim`` wide."""
    head_dim = _check_rotary_dim(head_dim)
    if not _is_number(theta) or not math.isfinite(theta) or theta <= 0:
        raise ConfigError("theta", f"expected a finite number > 0 (rope_theta), got {theta!r}")
    if not _is_number(partial_rotary_factor) or not 0 < partial_rotary_factor <= 1:
        raise ConfigError("partial_rotary_factor", f"expected a number in (0, 1], got {partial_rotary_factor!r}")
    if not _is_number(factor) or not math.isfinite(factor) or factor <= 0:
        raise ConfigError("factor", f"expected a finite number > 0, got {factor!r}")
    angles = int(partial_rotary_factor * head_dim // 2)
    inv = np.zeros(head_dim // 2, dtype=np.float64)
    inv[:angles] = float(theta) ** (-np.arange(angles, dtype=np.float64) * 2.0 / head_dim)
    out: np.ndarray = inv / float(factor)
    return out


def rope_cos_sin_rows(positions: np.ndarray, inv_freq: np.ndarray, attention_factor: float = 1.0) -> np.ndarray:
    """float32 ``[N, 2 * len(inv_freq)]``: row n is ``[cos(p_n * inv_freq) | sin(p_n * inv_freq)]`` (times the
    attention factor) for integer ``positions`` [N]. A new host array owned by the caller."""
    pos = np.asarray(positions)
    if pos.ndim != 1 or not np.issubdtype(pos.dtype, np.integer):
        raise ShapeError(f"positions: expected integer positions of shape [N], got {pos.shape} {pos.dtype}")
    return _rows(pos.astype(np.float64)[:, None] * np.asarray(inv_freq, np.float64)[None, :], attention_factor)


def no_rope_cos_sin_rows(count: int, width: int) -> np.ndarray:
    """float32 ``[count, width]``: the rows of a model without RoPE (``use_rope: false``, Nemotron-H): cos 1 and sin 0
    in every row, so a rotation by any of them leaves q and k as they are. Edge-LLM's runtime fills its table so
    (``llmRuntimeUtils.cpp::collectRopeConfig`` gives ``kNoRope``, ``ropeCache.cpp`` calls
    ``initializeNopeCosSinCache``) and its attention plugin rotates by it like by any other table. A new host array
    owned by the caller."""
    check_int(count, "count", minimum=0, error=ConfigError)
    _check_rotary_dim(width)
    rows = np.zeros((count, width), np.float32)
    rows[:, :width // 2] = 1.0
    return rows


def _rows(angles: np.ndarray, attention_factor: float) -> np.ndarray:
    rows = np.concatenate([np.cos(angles), np.sin(angles)], axis=-1)
    if attention_factor != 1.0:
        rows = rows * attention_factor
    return rows.astype(np.float32)


def rope_cos_sin_table(max_positions: int, rotary_dim: int, theta: float = 10000.0, batch: int = 1, *,
                       scaling: RopeScaling | None = None,
                       max_position_embeddings: int | None = None) -> np.ndarray:
    """float32 ``[batch, max_positions, rotary_dim]``: row p is ``[cos(p * inv_freq) | sin(p * inv_freq)]``
    times the attention factor, with ``inv_freq`` and the factor from :func:`rope_parameters`.

    Angles are computed in float64 and rounded once. ``batch > 1`` replicates the table per slot
    (MRoPE's text-only initialisation: with equal temporal, height and width positions every
    ``mrope_section`` layout gives this same table). A static table cannot follow the current
    sequence length that HF's ``dynamic`` and ``longrope`` depend on, so it is HF's result for a
    sequence of ``max_positions`` tokens (seq_len = max_positions), which is also Edge-LLM's LongRoPE table
    (short factors within ``original_max_position_embeddings``, long ones past it); an engine's config refuses
    ``dynamic`` past ``max_position_embeddings`` and ``longrope`` past ``original_max_position_embeddings``, where
    that result is not HF's for shorter sequences (``docs/edgellm-assumptions.md`` §5.2).
    The returned array is a new, C-contiguous host array owned by the caller.
    """
    _check_rotary_dim(rotary_dim)
    check_int(max_positions, "max_positions", minimum=0, error=ConfigError)
    check_int(batch, "batch", minimum=1, error=ConfigError)
    inv_freq, attention_factor = rope_parameters(rotary_dim, theta, scaling,
                                                 max_position_embeddings=max_position_embeddings,
                                                 seq_len=max_positions)
    angles = np.arange(max_positions, dtype=np.float64)[:, None] * inv_freq[None, :]
    table = _rows(angles, attention_factor)
    return np.ascontiguousarray(np.broadcast_to(table, (batch, max_positions, rotary_dim)))


def _mrope_axes(half: int, section: tuple[int, ...], interleaved: bool) -> np.ndarray:
    """Which position axis (0 temporal, 1 height, 2 width) each of the ``half`` frequencies follows.

    Qwen2-VL / Qwen2.5-VL: consecutive blocks of section[0], section[1], section[2] frequencies.
    Qwen3-VL (interleaved): frequency i is height when i % 3 == 1 and i < 3 * section[1], width when
    i % 3 == 2 and i < 3 * section[2], temporal otherwise; a run that would pass the last frequency stops there
    (Qwen3.5's [11, 11, 10] over 32: height at 1, 4, .., 31), as Hugging Face's ``apply_interleaved_mrope`` slices
    and Edge-LLM's ``initializeMRopeCosSinKernel`` tests ``i < 3 * section``.
    """
    if interleaved:
        axes = np.zeros(half, dtype=np.intp)
        axes[1:3 * section[1]:3] = 1
        axes[2:3 * section[2]:3] = 2
        return axes
    return np.repeat(np.arange(3, dtype=np.intp), section)


def mrope_cos_sin_rows(position_ids: np.ndarray, rotary_dim: int, theta: float, mrope_section: Sequence[int], *,
                       interleaved: bool = False, scaling: RopeScaling | None = None,
                       max_position_embeddings: int | None = None) -> np.ndarray:
    """float32 ``[N, rotary_dim]`` MRoPE rows for 3-D positions ``[3, N]`` (temporal, height, width).

    Frequency i takes its angle from the position axis HF assigns to it: consecutive blocks of
    ``mrope_section`` (Qwen2-VL, Qwen2.5-VL) or, with ``interleaved``, Qwen3-VL's layout (see
    ``_mrope_axes``). Row n is ``[cos(angle) | sin(angle)] * attention_factor`` as in
    :func:`rope_cos_sin_table`; ``dynamic`` / ``longrope`` scaling sees ``seq_len = max(position_ids) + 1``,
    as HF does. A ``scaling`` that carries its own ``mrope_section`` / ``mrope_interleaved`` must agree
    with the arguments. The returned array is a new host array owned by the caller.
    """
    rotary_dim = _check_rotary_dim(rotary_dim)
    half = rotary_dim // 2
    section = _check_section("mrope_section", mrope_section)
    if sum(section) != half:
        raise ConfigError("mrope_section", f"expected counts summing to rotary_dim / 2 = {half}, "
                                           f"got {list(section)} (sum {sum(section)})")
    _check_bool("interleaved", interleaved)
    if scaling is not None:
        if scaling.mrope_section is not None and scaling.mrope_section != section:
            raise ConfigError(scaling._key("mrope_section"),
                              f"is {list(scaling.mrope_section)} but mrope_section={list(section)} was passed")
        if scaling.mrope_section is not None and scaling.mrope_interleaved != interleaved:
            raise ConfigError(scaling._key("mrope_interleaved"),
                              f"is {scaling.mrope_interleaved} but interleaved={interleaved} was passed")
    pos = np.asarray(position_ids)
    if pos.ndim != 2 or pos.shape[0] != 3 or not np.issubdtype(pos.dtype, np.integer):
        raise ShapeError(f"position_ids: expected integer positions of shape [3, N], got {pos.shape} {pos.dtype}")
    seq_len = int(pos.max()) + 1 if pos.size else 0
    inv_freq, attention_factor = rope_parameters(rotary_dim, theta, scaling,
                                                 max_position_embeddings=max_position_embeddings,
                                                 seq_len=max(seq_len, 0))
    axes = _mrope_axes(half, section, interleaved)
    angles = pos.astype(np.float64)[axes, :].T * inv_freq[None, :]
    return _rows(angles, attention_factor)
