"""VisualConfig: a vision-language model's ViT engine directory (``visual/``), as Edge-LLM 0.11 writes it.

Edge-LLM's builder writes ``visual/config.json`` beside ``visual/visual.engine``: the checkpoint's
``vision_config``, the image and vision-marker token ids, the LLM's ``rope_scaling`` and the
``builder_config`` token caps the engine was built for (``min_image_tokens``, ``max_image_tokens``,
``max_image_tokens_per_image``); it copies the checkpoint's ``preprocessor_config.json`` (Hugging Face's
image processor: mean, std, rescale factor, resize bounds) beside it. :class:`VisualConfig` reads both,
for the two ViT kinds trtio binds:

* ``qwen2_5_vl`` (Qwen2.5-VL): window attention, inputs ``cu_window_seqlens``, ``window_index``,
  ``reverse_window_index`` (``vision_config.window_size``);
* ``qwen3_vl`` (Qwen3-VL): interpolated learned position embeddings, inputs ``fast_pos_embed_idx`` /
  ``fast_pos_embed_weight`` (``vision_config.num_position_embeddings``), and one ``deepstack_features_i``
  output per entry of ``vision_config.deepstack_visual_indexes``;
* ``qwen3_omni_vision_encoder`` (Qwen3-Omni's thinker): Qwen3-VL's ViT, exported by Edge-LLM through the same
  module (``Qwen3VLVisualModel``, only the checkpoint's key names translated): the same inputs, outputs and image
  positions, bound as ``qwen3_vl``. Its ``vision_config.position_id_per_seconds`` scales a video's time axis
  only (an image's is 0): trtio splices images, not video, and keeps it in :attr:`VisualConfig.extras`.

Any other ``model_type`` (Qwen2-VL, Qwen3.5, Gemma 4, ...) is refused naming it; InternVL's and Phi-4-MM's
(``phi4mm``) have their own configs (:mod:`~trtio.components.visual.visual_kinds`). Keys
that only shape the engine's own computation (``depth``, ``hidden_act``, ``intermediate_size``,
``fullatt_block_indexes``, ...) stay in :attr:`VisualConfig.extras`: trtio computes no ViT layer.
``docs/edgellm-assumptions.md`` (section "Vision-language models") lists what is assumed.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from trtio._checks import is_int
from trtio.components.config_files import PREPROCESSOR_FILE, ComponentFiles, keys_of
from trtio.errors import ConfigError

__all__ = ["PREPROCESSOR_FILE", "VISION_KINDS", "VISUAL_CONFIG_FILE", "VisualConfig"]

#: The ViT kinds trtio binds (``model_type`` of ``visual/config.json``).
VISION_KINDS = ("qwen2_5_vl", "qwen3_vl", "qwen3_omni_vision_encoder")
VISUAL_CONFIG_FILE = "config.json"
# PIL's resampling filter numbers (Hugging Face's PILImageResampling): the Qwen processors resize bicubically.
_BICUBIC = 3


@dataclass(frozen=True)
class VisualConfig:
    """A ViT engine's config (see module docstring); build it with :meth:`from_edgellm` or :meth:`from_dir`.

    ``image_mean`` / ``image_std`` are None where the directory has no ``preprocessor_config.json``: the
    engine binds without them, :func:`trtio.vision.preprocess` refuses to run.
    """

    model_type: str
    patch_size: int
    temporal_patch_size: int
    merge_size: int
    in_channels: int
    hidden_size: int  # the ViT's width
    num_heads: int
    out_hidden_size: int  # a merged image token's width: the LLM's hidden size
    min_image_tokens: int
    max_image_tokens: int
    max_image_tokens_per_image: int
    image_token_id: int
    vision_start_token_id: int
    vision_end_token_id: int | None = None
    video_token_id: int | None = None
    mrope_section: tuple[int, ...] | None = None
    mrope_interleaved: bool = False
    window_size: int = 0  # qwen2_5_vl
    num_position_embeddings: int = 0  # qwen3_vl
    deepstack_visual_indexes: tuple[int, ...] = ()  # qwen3_vl
    image_mean: tuple[float, ...] | None = None
    image_std: tuple[float, ...] | None = None
    rescale_factor: float = 1.0 / 255.0
    do_resize: bool = True
    do_rescale: bool = True
    do_normalize: bool = True
    processor_min_pixels: int | None = None  # the image processor's own resize bounds, where it gives them
    processor_max_pixels: int | None = None
    extras: Mapping[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if self.model_type not in VISION_KINDS:
            raise ConfigError("model_type", f"{self.model_type!r} is not a ViT kind trtio binds (expected one of "
                                            f"{list(VISION_KINDS)})")
        for name in ("patch_size", "temporal_patch_size", "merge_size", "in_channels", "hidden_size", "num_heads",
                     "out_hidden_size", "min_image_tokens", "max_image_tokens", "max_image_tokens_per_image"):
            value = getattr(self, name)
            if not is_int(value) or value < 1:
                raise ConfigError(name, f"expected an integer >= 1, got {value!r}")
        if self.hidden_size % self.num_heads or (self.hidden_size // self.num_heads) % 4:
            raise ConfigError("vision_config.hidden_size",
                              f"{self.hidden_size} over {self.num_heads} heads must give a head size divisible by 4 "
                              f"(the rotary table holds head_dim / 4 frequencies for each of the two axes)")
        if self.min_image_tokens > self.max_image_tokens_per_image or \
                self.max_image_tokens_per_image > self.max_image_tokens:
            raise ConfigError("builder_config", f"expected min_image_tokens <= max_image_tokens_per_image <= "
                                                f"max_image_tokens, got {self.min_image_tokens}, "
                                                f"{self.max_image_tokens_per_image}, {self.max_image_tokens}")
        if self.model_type == "qwen2_5_vl":
            if not is_int(self.window_size) or self.window_size < self.factor or self.window_size % self.factor:
                raise ConfigError("vision_config.window_size",
                                  f"expected a multiple of patch_size x spatial_merge_size = {self.factor} (a window "
                                  f"of whole merged tokens), got {self.window_size!r}")
        else:
            side = math.isqrt(self.num_position_embeddings) if is_int(self.num_position_embeddings) \
                and self.num_position_embeddings > 0 else 0
            if side < 2 or side * side != self.num_position_embeddings:
                raise ConfigError("vision_config.num_position_embeddings",
                                  f"expected a square number >= 4 (a side x side grid of learned positions), got "
                                  f"{self.num_position_embeddings!r}")
        for stat in ("image_mean", "image_std"):
            values = getattr(self, stat)
            positive = stat == "image_std"
            if values is not None and (len(values) != self.in_channels or (positive and min(values) <= 0)):
                raise ConfigError(stat, f"expected {self.in_channels} numbers (one per channel"
                                        f"{', each > 0' if positive else ''}), got {list(values)}")
        object.__setattr__(self, "extras", MappingProxyType(dict(self.extras)))

    # -- reading ------------------------------------------------------------------------------
    @classmethod
    def from_edgellm(cls, data: Mapping[str, Any], *, preprocessor: Mapping[str, Any] | None = None,
                     what: str = VISUAL_CONFIG_FILE, preprocessor_what: str = PREPROCESSOR_FILE) -> VisualConfig:
        """The config of a ``visual/config.json`` (``data``) and, where given, its ``preprocessor_config.json``.

        Raises :class:`ConfigError` naming ``"<what>: <dotted key>"`` for a missing or malformed key, another
        ``model_type`` than :data:`VISION_KINDS`, or a preprocessing key trtio cannot honour (a resample filter
        other than bicubic)."""
        if not isinstance(data, Mapping):
            raise ConfigError(what, f"expected a JSON object, got {type(data).__name__}")
        with keys_of(what):
            kind = data.get("model_type")
            if kind not in VISION_KINDS:
                raise ConfigError("model_type", f"{kind!r} is not a ViT kind trtio binds (expected one of "
                                                f"{list(VISION_KINDS)}); this directory's vision encoder is not "
                                                f"supported")
            vision = _section(data, "vision_config")
            builder = _section(data, "builder_config",
                               "holds the token caps Edge-LLM's builder writes when it builds the visual engine")
            values: dict[str, Any] = {
                "model_type": kind,
                "patch_size": _int(vision, "vision_config", "patch_size"),
                "temporal_patch_size": _int(vision, "vision_config", "temporal_patch_size"),
                "merge_size": _int(vision, "vision_config", "spatial_merge_size"),
                "in_channels": _int(vision, "vision_config", "in_channels", default=3),
                "hidden_size": _int(vision, "vision_config", "hidden_size"),
                "num_heads": _int(vision, "vision_config", "num_heads"),
                "out_hidden_size": _int(vision, "vision_config", "out_hidden_size"),
                "min_image_tokens": _int(builder, "builder_config", "min_image_tokens"),
                "max_image_tokens": _int(builder, "builder_config", "max_image_tokens"),
                "max_image_tokens_per_image": _int(builder, "builder_config", "max_image_tokens_per_image"),
                "image_token_id": _int(data, "", "image_token_id", minimum=0),
                "vision_start_token_id": _int(data, "", "vision_start_token_id", minimum=0),
                "vision_end_token_id": _int(data, "", "vision_end_token_id", minimum=0, optional=True),
                "video_token_id": _int(data, "", "video_token_id", minimum=0, optional=True),
            }
            rope = data.get("rope_scaling")
            if isinstance(rope, Mapping) and rope.get("mrope_section") is not None:
                section = rope["mrope_section"]
                if not isinstance(section, list) or len(section) != 3 or not all(is_int(x) for x in section):
                    raise ConfigError("rope_scaling.mrope_section", f"expected 3 integers, got {section!r}")
                values["mrope_section"] = tuple(int(x) for x in section)
                values["mrope_interleaved"] = bool(rope.get("mrope_interleaved", kind != "qwen2_5_vl"))
            if kind == "qwen2_5_vl":
                values["window_size"] = _int(vision, "vision_config", "window_size")
            else:
                values["num_position_embeddings"] = _int(vision, "vision_config", "num_position_embeddings")
                indexes = vision.get("deepstack_visual_indexes", [])
                if not isinstance(indexes, list) or not all(is_int(x) and x >= 0 for x in indexes):
                    raise ConfigError("vision_config.deepstack_visual_indexes",
                                      f"expected a list of layer indexes, got {indexes!r}")
                values["deepstack_visual_indexes"] = tuple(int(x) for x in indexes)
            used = {"patch_size", "temporal_patch_size", "spatial_merge_size", "in_channels", "hidden_size",
                    "num_heads", "out_hidden_size", "window_size", "num_position_embeddings",
                    "deepstack_visual_indexes"}
            extras = {f"vision_config.{k}": v for k, v in vision.items() if k not in used}
            extras.update({k: v for k, v in data.items()
                           if k not in ("model_type", "vision_config", "builder_config", "image_token_id",
                                        "vision_start_token_id", "vision_end_token_id", "video_token_id")})
            values["extras"] = extras
        if preprocessor is not None:
            with keys_of(preprocessor_what):
                values.update(_preprocessing(preprocessor, values))
        with keys_of(what):
            return cls(**values)

    @classmethod
    def from_dir(cls, path: str | os.PathLike[str]) -> VisualConfig:
        """Read ``path/config.json`` and, where present, ``path/preprocessor_config.json`` (a ``visual/``
        directory). ConfigError naming the file for a missing config."""
        files = ComponentFiles("VisualConfig.from_dir", path, VISUAL_CONFIG_FILE)
        return cls.from_edgellm(files.data, preprocessor=files.preprocessor, what=files.what,
                                preprocessor_what=files.preprocessor_what)

    # -- derived sizes --------------------------------------------------------------------------
    @property
    def kind(self) -> str:
        """Which vision encoder this is (its ``model_type``)."""
        return self.model_type

    @property
    def factor(self) -> int:
        """Pixels per merged token along each side: ``patch_size * merge_size`` (images are resized to it)."""
        return self.patch_size * self.merge_size

    @property
    def merge_unit(self) -> int:
        """Patches per merged image token (``merge_size ** 2``)."""
        return self.merge_size * self.merge_size

    @property
    def patch_dim(self) -> int:
        """Values of one flattened patch: ``in_channels * temporal_patch_size * patch_size ** 2``."""
        return self.in_channels * self.temporal_patch_size * self.patch_size * self.patch_size

    @property
    def rotary_dim(self) -> int:
        """Width of ``rotary_pos_emb``: half the ViT head size (height and width frequencies, side by side)."""
        return self.hidden_size // self.num_heads // 2

    @property
    def has_windows(self) -> bool:
        """Qwen2.5-VL's window attention (``cu_window_seqlens``, ``window_index``, ``reverse_window_index``)."""
        return self.model_type == "qwen2_5_vl"

    @property
    def num_deepstack(self) -> int:
        """The engine's ``deepstack_features_i`` outputs (0 for Qwen2.5-VL)."""
        return len(self.deepstack_visual_indexes)

    @property
    def grid_side(self) -> int:
        """Qwen3-VL: the side of the learned position grid (``sqrt(num_position_embeddings)``)."""
        return math.isqrt(self.num_position_embeddings)

    @property
    def max_patches(self) -> int:
        """Patches the engine takes in one call (``max_image_tokens`` merged tokens)."""
        return self.max_image_tokens * self.merge_unit

    @property
    def min_patches(self) -> int:
        return self.min_image_tokens * self.merge_unit

    @property
    def max_frames(self) -> int:
        """Frames (``cu_seqlens`` segments) of one call: Edge-LLM's builder sizes ``cu_seqlens`` for
        ``max(2, max_image_tokens // min_image_tokens + 1)`` entries."""
        return max(2, self.max_image_tokens // self.min_image_tokens + 1) - 1

    @property
    def max_windows(self) -> int:
        """Attention windows of one call (Qwen2.5-VL): ``cu_window_seqlens`` holds up to ``max_image_tokens``
        entries in Edge-LLM's builder."""
        return self.max_image_tokens - 1

    @property
    def max_frame_patches(self) -> int:
        """Patches of one frame: the extent ``max_seqlen_carrier`` may take (``max_image_tokens_per_image``
        merged tokens)."""
        return self.max_image_tokens_per_image * self.merge_unit

    @property
    def min_pixels(self) -> int:
        """The fewest pixels an image is resized to: the engine's ``min_image_tokens`` (as Edge-LLM's runtime
        reads it), or the image processor's own bound where that is larger."""
        floor = self.min_image_tokens * self.factor * self.factor
        return max(floor, self.processor_min_pixels or 0)

    @property
    def max_pixels(self) -> int:
        """The most pixels an image is resized to: the engine's ``max_image_tokens_per_image`` (as Edge-LLM's
        runtime reads it), or the image processor's own bound where that is smaller."""
        cap = self.max_image_tokens_per_image * self.factor * self.factor
        return min(cap, self.processor_max_pixels) if self.processor_max_pixels else cap

    def image_tokens(self, grid_thw: tuple[int, int, int]) -> int:
        """The LLM tokens an image of patch grid ``(t, h, w)`` becomes: ``t * h * w / merge_size ** 2``."""
        t, h, w = grid_thw
        return t * h * w // self.merge_unit


def _section(data: Mapping[str, Any], key: str, why: str = "") -> Mapping[str, Any]:
    section = data.get(key)
    if not isinstance(section, Mapping):
        got = "absent" if section is None else f"a {type(section).__name__}"
        raise ConfigError(key, f"is {got}; expected an object{' (it ' + why + ')' if why else ''}")
    return section


def _int(data: Mapping[str, Any], section: str, key: str, *, default: int | None = None, minimum: int = 1,
         optional: bool = False) -> Any:
    name = f"{section}.{key}" if section else key
    value = data.get(key)
    if value is None:
        if default is not None or optional:
            return default
        raise ConfigError(name, "is missing")
    if not is_int(value) or value < minimum:
        raise ConfigError(name, f"expected an integer >= {minimum}, got {value!r}")
    return int(value)


def _preprocessing(data: Mapping[str, Any], values: Mapping[str, Any]) -> dict[str, Any]:
    """The keys of a Qwen image processor's ``preprocessor_config.json`` that change its numbers, checked
    against the engine's config."""
    if not isinstance(data, Mapping):
        raise ConfigError("", f"expected a JSON object, got {type(data).__name__}")
    out: dict[str, Any] = {}
    for key, field_name in (("patch_size", "patch_size"), ("temporal_patch_size", "temporal_patch_size"),
                            ("merge_size", "merge_size")):
        given = data.get(key)
        if given is not None and given != values[field_name]:
            raise ConfigError(key, f"is {given!r}, but the visual engine's config says {values[field_name]}")
    resample = data.get("resample", _BICUBIC)
    if resample != _BICUBIC:
        raise ConfigError("resample", f"is {resample!r}; trtio resizes bicubically (PIL's filter 3) as the Qwen "
                                      "image processors do, and implements no other filter")
    for key in ("do_resize", "do_rescale", "do_normalize", "do_convert_rgb"):
        flag = data.get(key, True)
        if not isinstance(flag, bool):
            raise ConfigError(key, f"expected true or false, got {flag!r}")
        if key != "do_convert_rgb":
            out[key] = flag
    for stat in ("image_mean", "image_std"):
        values_ = data.get(stat)
        if values_ is None:
            raise ConfigError(stat, "is missing (the image processor normalises with it)")
        if isinstance(values_, (int, float)) and not isinstance(values_, bool):
            values_ = [values_] * int(values.get("in_channels") or 3)
        if not isinstance(values_, list) or not all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                     for x in values_):
            raise ConfigError(stat, f"expected a list of numbers, got {values_!r}")
        out[stat] = tuple(float(x) for x in values_)
    factor = data.get("rescale_factor", 1.0 / 255.0)
    if not isinstance(factor, (int, float)) or isinstance(factor, bool) or not math.isfinite(factor) or factor <= 0:
        raise ConfigError("rescale_factor", f"expected a number > 0, got {factor!r}")
    out["rescale_factor"] = float(factor)
    # Hugging Face: size = {"shortest_edge": min_pixels, "longest_edge": max_pixels}; legacy min_pixels /
    # max_pixels keys override it, as Qwen2VLImageProcessor.__init__ does.
    size = data.get("size")
    lo = size.get("shortest_edge") if isinstance(size, Mapping) else None
    hi = size.get("longest_edge") if isinstance(size, Mapping) else None
    lo = data.get("min_pixels", lo)
    hi = data.get("max_pixels", hi)
    for key, v in (("min_pixels", lo), ("max_pixels", hi)):
        if v is not None and (not is_int(v) or v < 1):
            raise ConfigError(f"size ({key})", f"expected an integer >= 1, got {v!r}")
    out["processor_min_pixels"] = None if lo is None else int(lo)
    out["processor_max_pixels"] = None if hi is None else int(hi)
    return out
