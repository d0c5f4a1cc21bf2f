"""InternVLConfig: InternVL 3.5's vision encoder directory (``visual/``, ``model_type`` ``internvl``), as Edge-LLM 0.11
writes it.

``visual/config.json`` holds the checkpoint's ``vision_config`` (InternViT: ``image_size`` and ``patch_size`` as
``[h, w]``, ``num_channels``, ``hidden_size``, ``num_attention_heads``), its ``text_config`` (the LLM's width the
projected rows take), ``downsample_ratio`` (the pixel shuffle: 0.5 merges 2 x 2 patches; Edge-LLM's runtime and
Hugging Face default to 0.5 where it is absent), ``image_token_id`` (``<IMG_CONTEXT>``), ``img_start_token_id`` /
``img_end_token_id`` (``<img>`` / ``</img>``, where the builder found them in the tokenizer) and the builder's token
caps (``builder_config``: ``min_image_tokens``, ``max_image_tokens``, ``max_image_tokens_per_image``). The engine takes
``input`` FP16 ``[tiles, C, H, W]`` (one optimization profile of ``min_image_tokens // 256 .. max_image_tokens //
256`` tiles) and returns ``output`` ``[tokens_per_tile * tiles, text hidden]``.

``preprocessor_config.json`` (the checkpoint's ``GotOcr2ImageProcessor`` config, copied beside the graph) gives the
tiling and normalisation Hugging Face's processor applies: ``crop_to_patches``, ``min_patches`` / ``max_patches``
(tiles of the grid, the thumbnail not counted), ``size`` (the tile: equal to ``image_size``), ``image_mean`` /
``image_std``, ``rescale_factor``, ``do_*``, ``resample`` (bicubic only). Without the file trtio does what Edge-LLM's
``InternViTRunner`` does: ImageNet mean and std, tiles between ``max(1, min_image_tokens / tokens_per_tile - 1)`` and
``max(1, max_image_tokens_per_image / tokens_per_tile - 1)``. ``docs/edgellm-assumptions.md`` ("InternVL") lists
where Edge-LLM's runtime and Hugging Face's processor differ, and which trtio follows.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from trtio._checks import is_int
from trtio._json import read_json
from trtio.errors import ConfigError, InvalidTypeError

__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "INTERNVL_KIND", "InternVLConfig"]

INTERNVL_KIND = "internvl"
#: What Edge-LLM's ``InternViTConfig`` normalises with (it reads no preprocessor file).
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
_CONFIG_FILE = "config.json"
_PREPROCESSOR_FILE = "preprocessor_config.json"
_BICUBIC = 3
# Keys of the vision config that only shape the engine's own computation (trtio computes no ViT layer).
_USED_VISION = ("image_size", "patch_size", "num_channels", "hidden_size", "num_attention_heads")


@dataclass(frozen=True)
class InternVLConfig:
    """An InternVL vision encoder's config (see module docstring); build it with :meth:`from_edgellm` or
    :meth:`from_dir`. ``kind`` is ``"internvl"``; ``min_tiles`` / ``max_tiles`` bound the tile grid (thumbnail not
    counted), ``crop_to_patches`` false resizes every image to one tile."""

    image_size: int  # a tile's side, in pixels
    patch_size: int
    in_channels: int
    hidden_size: int  # the ViT's width
    num_heads: int
    out_hidden_size: int  # a projected row's width: the LLM's hidden size
    vocab_size: int
    downsample_ratio: float
    min_image_tokens: int
    max_image_tokens: int
    max_image_tokens_per_image: int
    image_token_id: int
    img_start_token_id: int | None = None
    img_end_token_id: int | None = None
    image_mean: tuple[float, ...] = IMAGENET_MEAN
    image_std: tuple[float, ...] = IMAGENET_STD
    rescale_factor: float = 1.0 / 255.0
    do_resize: bool = True
    do_rescale: bool = True
    do_normalize: bool = True
    crop_to_patches: bool = True
    min_tiles: int = 1
    max_tiles: int = 12
    extras: Mapping[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        for name in ("image_size", "patch_size", "in_channels", "hidden_size", "num_heads", "out_hidden_size",
                     "vocab_size", "min_image_tokens", "max_image_tokens", "max_image_tokens_per_image", "min_tiles",
                     "max_tiles"):
            value = getattr(self, name)
            if not is_int(value) or value < 1:
                raise ConfigError(name, f"expected an integer >= 1, got {value!r}")
        if self.image_size % self.patch_size:
            raise ConfigError("vision_config.patch_size", f"{self.patch_size} does not divide the tile side "
                                                          f"{self.image_size}")
        ratio = self.downsample_ratio
        scale = round(1.0 / ratio) if isinstance(ratio, (int, float)) and 0 < ratio <= 1 else 0
        if scale < 1 or not math.isclose(scale * ratio, 1.0) or self.patches_per_side % scale:
            raise ConfigError("downsample_ratio", f"expected 1 / n for a whole n dividing the {self.patches_per_side} "
                                                  f"patches of a tile's side, got {ratio!r}")
        if self.hidden_size % self.num_heads:
            raise ConfigError("vision_config.num_attention_heads", f"{self.num_heads} heads do not divide the ViT "
                                                                   f"width {self.hidden_size}")
        if self.min_image_tokens > self.max_image_tokens_per_image or \
                self.max_image_tokens_per_image > self.max_image_tokens:
            raise ConfigError("builder_config", f"expected min_image_tokens <= max_image_tokens_per_image <= "
                                                f"max_image_tokens, got {self.min_image_tokens}, "
                                                f"{self.max_image_tokens_per_image}, {self.max_image_tokens}")
        if self.min_tiles > self.max_tiles:
            raise ConfigError("min_patches", f"{self.min_tiles} is more than max_patches {self.max_tiles}")
        for name in ("image_token_id", "img_start_token_id", "img_end_token_id"):
            value = getattr(self, name)
            if value is not None and (not is_int(value) or not 0 <= value < self.vocab_size):
                raise ConfigError(name, f"expected a token id in 0..{self.vocab_size - 1} (text_config.vocab_size), "
                                        f"got {value!r}")
        for stat in ("image_mean", "image_std"):
            values = getattr(self, stat)
            if len(values) != self.in_channels or (stat == "image_std" and min(values) <= 0):
                raise ConfigError(stat, f"expected {self.in_channels} numbers (one per channel"
                                        f"{', each > 0' if stat == 'image_std' else ''}), got {list(values)}")
        object.__setattr__(self, "extras", MappingProxyType(dict(self.extras)))

    # -- reading ------------------------------------------------------------------------------
    @classmethod
    def from_edgellm(cls, data: Mapping[str, Any], *, preprocessor: Mapping[str, Any] | None = None,
                     what: str = _CONFIG_FILE, preprocessor_what: str = _PREPROCESSOR_FILE) -> InternVLConfig:
        """The config of an InternVL ``visual/config.json`` (``data``) and, where given, its
        ``preprocessor_config.json``. ConfigError naming ``"<what>: <dotted key>"`` for a missing or malformed
        key, another ``model_type``, or a preprocessing key trtio cannot honour."""
        if not isinstance(data, Mapping):
            raise ConfigError(what, f"expected a JSON object, got {type(data).__name__}")
        try:
            values = _read_visual(data)
        except ConfigError as exc:
            raise ConfigError(f"{what}: {exc.field}" if exc.field else what, exc.message) from None
        if preprocessor is not None:
            try:
                values.update(_preprocessing(preprocessor, values))
            except ConfigError as exc:
                raise ConfigError(f"{preprocessor_what}: {exc.field}", exc.message) from None
        else:  # InternViTRunner's own tile bounds (computeBestBlockGridForResize)
            per_tile = values["tokens_per_tile"]
            values["min_tiles"] = max(1, values["min_image_tokens"] // per_tile - 1)
            values["max_tiles"] = max(1, values["max_image_tokens_per_image"] // per_tile - 1)
        values.pop("tokens_per_tile")
        try:
            return cls(**values)
        except ConfigError as exc:
            raise ConfigError(f"{what}: {exc.field}", exc.message) from None

    @classmethod
    def from_dir(cls, path: str | os.PathLike[str]) -> InternVLConfig:
        """Read ``path/config.json`` and, where present, ``path/preprocessor_config.json`` (a ``visual/``
        directory)."""
        if not isinstance(path, (str, os.PathLike)):
            raise InvalidTypeError(f"InternVLConfig.from_dir: expected a directory path, got {type(path).__name__}")
        root = Path(path)
        file, pre_file = root / _CONFIG_FILE, root / _PREPROCESSOR_FILE
        pre = read_json(pre_file) if pre_file.is_file() else None
        if pre is not None and not isinstance(pre, Mapping):
            raise ConfigError(str(pre_file), f"expected a JSON object, got {type(pre).__name__}")
        return cls.from_edgellm(read_json(file), preprocessor=pre, what=str(file), preprocessor_what=str(pre_file))

    # -- derived sizes --------------------------------------------------------------------------
    @property
    def kind(self) -> str:
        """Which encoder: ``"internvl"``."""
        return INTERNVL_KIND

    @property
    def model_type(self) -> str:
        return INTERNVL_KIND

    @property
    def patches_per_side(self) -> int:
        return self.image_size // self.patch_size

    @property
    def tokens_per_tile(self) -> int:
        """Rows one tile gives: ``(image_size / patch_size * downsample_ratio) ** 2`` (256 for InternVL 3.5)."""
        side = self.patches_per_side // round(1.0 / self.downsample_ratio)
        return side * side

    @property
    def min_engine_tiles(self) -> int:
        """The fewest tiles one call of the engine takes (Edge-LLM's builder: ``max(1, min_image_tokens // 256)``)."""
        return max(1, self.min_image_tokens // self.tokens_per_tile)

    @property
    def max_engine_tiles(self) -> int:
        """The most tiles one call of the engine takes (``max(1, max_image_tokens // 256)``)."""
        return max(1, self.max_image_tokens // self.tokens_per_tile)

    @property
    def tile_shape(self) -> tuple[int, int, int]:
        """One tile of ``input``: ``(channels, image_size, image_size)``."""
        return self.in_channels, self.image_size, self.image_size


def _square(vision: Mapping[str, Any], key: str) -> int:
    """``vision_config.<key>``: an integer or ``[h, w]`` with h == w (the exporter reshapes a tile's patches into a
    square grid)."""
    value = vision.get(key)
    if is_int(value):
        value = [value, value]
    if not isinstance(value, list) or len(value) != 2 or not all(is_int(v) and v >= 1 for v in value):
        raise ConfigError(f"vision_config.{key}", f"expected an integer >= 1 or [h, w], got {value!r}")
    if value[0] != value[1]:
        raise ConfigError(f"vision_config.{key}", f"is {value}; Edge-LLM's InternViT export takes square tiles "
                                                  "and patches only")
    return int(value[0])


def _int(data: Mapping[str, Any], name: str, key: str, *, minimum: int = 1, optional: bool = False) -> Any:
    value = data.get(key)
    if value is None:
        if optional:
            return None
        raise ConfigError(name, "is missing")
    if not is_int(value) or value < minimum:
        raise ConfigError(name, f"expected an integer >= {minimum}, got {value!r}")
    return int(value)


def _section(data: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    section = data.get(key)
    if not isinstance(section, Mapping):
        raise ConfigError(key, f"is {'absent' if section is None else type(section).__name__}; expected an object")
    return section


def _read_visual(data: Mapping[str, Any]) -> dict[str, Any]:
    kind = data.get("model_type")
    if kind != INTERNVL_KIND:
        raise ConfigError("model_type", f"is {kind!r}; an InternVL vision encoder's is {INTERNVL_KIND!r}")
    vision, text, builder = _section(data, "vision_config"), _section(data, "text_config"), \
        _section(data, "builder_config")
    ratio = data.get("downsample_ratio", 0.5)
    if not isinstance(ratio, (int, float)) or isinstance(ratio, bool):
        raise ConfigError("downsample_ratio", f"expected a number, got {ratio!r}")
    values: dict[str, Any] = {
        "image_size": _square(vision, "image_size"),
        "patch_size": _square(vision, "patch_size"),
        "in_channels": _int(vision, "vision_config.num_channels", "num_channels"),
        "hidden_size": _int(vision, "vision_config.hidden_size", "hidden_size"),
        "num_heads": _int(vision, "vision_config.num_attention_heads", "num_attention_heads"),
        "out_hidden_size": _int(text, "text_config.hidden_size", "hidden_size"),
        "vocab_size": _int(text, "text_config.vocab_size", "vocab_size"),
        "downsample_ratio": float(ratio),
        "min_image_tokens": _int(builder, "builder_config.min_image_tokens", "min_image_tokens"),
        "max_image_tokens": _int(builder, "builder_config.max_image_tokens", "max_image_tokens"),
        "max_image_tokens_per_image": _int(builder, "builder_config.max_image_tokens_per_image",
                                           "max_image_tokens_per_image"),
        "image_token_id": _int(data, "image_token_id", "image_token_id", minimum=0),
        "img_start_token_id": _int(data, "img_start_token_id", "img_start_token_id", minimum=0, optional=True),
        "img_end_token_id": _int(data, "img_end_token_id", "img_end_token_id", minimum=0, optional=True),
    }
    side = values["image_size"] // values["patch_size"]
    scale = round(1.0 / values["downsample_ratio"]) if values["downsample_ratio"] > 0 else 1
    values["tokens_per_tile"] = max(1, (side // max(1, scale)) ** 2)
    extras = {f"vision_config.{k}": v for k, v in vision.items() if k not in _USED_VISION}
    extras.update({k: v for k, v in data.items() if k not in ("model_type", "vision_config", "text_config",
                                                              "builder_config", "downsample_ratio", "image_token_id",
                                                              "img_start_token_id", "img_end_token_id")})
    values["extras"] = extras
    return values


def _flag(data: Mapping[str, Any], key: str, default: bool) -> bool:
    flag = data.get(key, default)
    if not isinstance(flag, bool):
        raise ConfigError(key, f"expected true or false, got {flag!r}")
    return flag


def _preprocessing(data: Mapping[str, Any], values: Mapping[str, Any]) -> dict[str, Any]:
    """The keys of a ``GotOcr2ImageProcessor`` config that change its numbers, checked against the engine's."""
    if not isinstance(data, Mapping):
        raise ConfigError("", f"expected a JSON object, got {type(data).__name__}")
    out: dict[str, Any] = {}
    resample = data.get("resample", _BICUBIC)
    if resample != _BICUBIC:
        raise ConfigError("resample", f"is {resample!r}; trtio resizes bicubically (PIL's filter 3) as InternVL's "
                                      "image processor does, and implements no other filter")
    for key in ("do_resize", "do_rescale", "do_normalize", "crop_to_patches"):
        out[key] = _flag(data, key, key != "crop_to_patches")
    if not _flag(data, "do_convert_rgb", True):
        raise ConfigError("do_convert_rgb", "is false; trtio converts every image to RGB (the ViT takes 3 channels)")
    if data.get("do_center_crop"):
        raise ConfigError("do_center_crop", "is set; InternVL's image processor does not crop, and trtio implements "
                                            "no center crop")
    size = data.get("size")
    tile = values["image_size"]
    if size is not None:
        if not isinstance(size, Mapping) or set(size) != {"height", "width"}:
            raise ConfigError("size", f"expected {{'height': h, 'width': w}}, got {size!r}")
        if size["height"] != tile or size["width"] != tile:
            raise ConfigError("size", f"is {dict(size)}, but the visual engine's tiles are {tile} x {tile} "
                                      "(vision_config.image_size)")
    for key, name in (("min_patches", "min_tiles"), ("max_patches", "max_tiles")):
        v = data.get(key, 1 if key == "min_patches" else 12)
        if not is_int(v) or v < 1:
            raise ConfigError(key, f"expected an integer >= 1, got {v!r}")
        out[name] = int(v)
    for stat in ("image_mean", "image_std"):
        given = data.get(stat)
        if given is None:
            raise ConfigError(stat, "is missing (the image processor normalises with it)")
        if isinstance(given, (int, float)) and not isinstance(given, bool):
            given = [given] * values["in_channels"]
        if not isinstance(given, list) or not all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                  for x in given):
            raise ConfigError(stat, f"expected a list of numbers, got {given!r}")
        if len(given) != values["in_channels"] or (stat == "image_std" and min(given) <= 0):
            raise ConfigError(stat, f"expected {values['in_channels']} numbers (one per channel"
                                    f"{', each > 0' if stat == 'image_std' else ''}), got {given}")
        out[stat] = tuple(float(x) for x in given)
    factor = data.get("rescale_factor", 1.0 / 255.0)
    if not isinstance(factor, (int, float)) or isinstance(factor, bool) or not math.isfinite(factor) or factor <= 0:
        raise ConfigError("rescale_factor", f"expected a number > 0, got {factor!r}")
    out["rescale_factor"] = float(factor)
    return out
