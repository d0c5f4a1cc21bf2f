"""The optimization profiles Edge-LLM 0.11's builder gives an engine, from its graph and builder config.

Decoders (:func:`builder_profiles`), read from the 0.11 package's
``experimental/builder/core/builder.py::_setup_llm_profiles`` and
``experimental/builder/core/ragged.py::decoder_profile_ranges``: profile 0 is prefill (a block draft's "context"
is its generation shape), profile 1 generation. A Qwen vision encoder (:func:`visual_profiles`), read from
``builder.py::_setup_component_profile`` (the visual component): one profile; an audio encoder
(:func:`audio_profiles`, the audio component of the same function): one profile. Every input gets ``(min, opt, max)``
per profile; a dimension the graph fixes keeps its value. ``scripts/make_parity_fixtures.py`` records what the real
builder functions set for each parity case (``profiles.json``), and the parity tests hold this reading to it.

Gemma 4's bounded-SWA inputs have no profile in that Python function (its own Gemma 4 graph has no SWA inputs);
for an exported graph they come from Edge-LLM's C++ builder, ``cpp/builder/llmBuilder.cpp``
(``setupCommonProfiles``: ``swa_kv_page_table`` as ``kv_page_table``, the shape-only ``swa_kv_cache_mode``
``(0, 1, 1)`` in both profiles; ``setupKVCacheProfiles`` with ``LLMBuilderConfig::resolveKVPoolPageProfile``: a
layer whose ``kv_layer_configs[i].kv_cache_capacity`` is reduced below ``max_kv_cache_capacity`` takes
``(min(bounded, full), min(bounded, full), max(bounded, full))`` pages, bounded = ``num_swa_pages`` (default
``max_batch_size x (2 * (ceil(W / 128) + 1) + 1)``, ``computeMinimumSwaPoolPages``)). :func:`swa_pool_pages` is that
default, which the builder also writes into ``builder_config.num_swa_pages``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trtio.errors import ConfigError

__all__ = ["Profiles", "audio_profiles", "builder_profiles", "reduced_capacity", "swa_pool_pages",
           "visual_profiles"]

Shape = tuple[int, ...]
Range = tuple[Shape, Shape, Shape]
Profiles = dict[str, tuple[Range, ...]]  # input -> its range in each profile

_PAGE = 128
_BLOCK_DRAFTS = ("dflash", "jetspec", "dspark")


@dataclass(frozen=True)
class _Extents:
    """``DecoderProfileRange``: (min, opt, max) of each dynamic extent."""

    sequences: Shape
    tokens: Shape
    offsets: Shape
    logits_rows: Shape

    def token(self, width: int = 0) -> Range:
        return _span((t, width) if width else (t,) for t in self.tokens)

    def sequence(self) -> Range:
        return _span((s,) for s in self.sequences)

    def offset(self) -> Range:
        return _span((o,) for o in self.offsets)


def _fixed(shape: Shape) -> Range:
    return shape, shape, shape


def _span(shapes: Iterable[Sequence[int]]) -> Range:
    """``(min, opt, max)`` from three shapes."""
    lo, opt, hi = (tuple(int(d) for d in s) for s in shapes)
    return lo, opt, hi


def _int(builder: Mapping[str, Any], key: str, default: int | None = None) -> int:
    value = builder.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"builder_config.{key}", f"is {value!r}; Edge-LLM's builder needs a positive int")
    return value


def reduced_capacity(config: Mapping[str, Any], capacity: int) -> int:
    """The sliding window W of a config whose ``kv_layer_configs`` give some layer a ``kv_cache_capacity`` below
    the engine's (``isReducedKvCacheCapacity``); 0 where none does. Every reduced layer must agree
    (``KVCacheManager``: "all SWA-capable layers must use one common kv_cache_capacity")."""
    seen = set()
    for layer in config.get("kv_layer_configs") or ():
        cap = (layer or {}).get("kv_cache_capacity", 0) if isinstance(layer, Mapping) else 0
        if isinstance(cap, int) and 0 < cap < capacity:
            seen.add(cap)
    if len(seen) > 1:
        raise ConfigError("kv_layer_configs", f"reduced kv_cache_capacity values {sorted(seen)} differ; Edge-LLM's "
                                              "KV cache manager takes one common window")
    return seen.pop() if seen else 0


def swa_pool_pages(batch: int, window: int) -> int:
    """``computeMinimumSwaPoolPages``: every sequence's private pages, ``2 * (ceil(W / 128) + 1) + 1``."""
    return batch * (2 * (-(-window // _PAGE) + 1) + 1)


def _pool_ranges(config: Mapping[str, Any], builder: Mapping[str, Any], batch: int, capacity: int,
                 pool_pages: int) -> Callable[[int, int, int], Range]:
    """``(layer, kv heads, head dim) -> its pool's range``: every page of the full pool, or, for a layer of reduced
    ``kv_cache_capacity`` (``LLMBuilderConfig::resolveKVPoolPageProfile``), ``min(bounded, full) .. max``."""
    window = reduced_capacity(config, capacity)
    swa_pages = int(builder.get("num_swa_pages", 0) or 0) or (swa_pool_pages(batch, window) if window else 0)
    caps = [e.get("kv_cache_capacity", 0) if isinstance(e, Mapping) else 0
            for e in config.get("kv_layer_configs") or ()]

    def pool_range(layer: int, heads: int, dim: int) -> Range:
        cap = caps[layer] if layer < len(caps) else 0
        if window and isinstance(cap, int) and 0 < cap < capacity:
            lo, hi = min(swa_pages, pool_pages), max(swa_pages, pool_pages)
            return _span((2, n, _PAGE, heads, dim) for n in (lo, lo, hi))
        return _fixed((2, pool_pages, _PAGE, heads, dim))
    return pool_range


def builder_profiles(inputs: Mapping[str, Sequence[int]], config: Mapping[str, Any],
                     builder: Mapping[str, Any]) -> Profiles:
    """Profiles 0 and 1 of every input of ``inputs`` (name -> the graph's shape, -1 where dynamic) for an engine
    whose ``config.json`` is ``config`` and whose ``builder_config`` is ``builder``. An input the builder sets no
    profile for (a static weight) gets its graph shape thrice; a dynamic one it does not know is a ConfigError."""
    role = "draft" if builder.get("spec_draft") else "base" if builder.get("spec_base") else "llm"
    spec_type = str(config.get("spec_decode_type", "none"))
    b = _int(builder, "max_batch_size")
    length = _int(builder, "max_input_len")
    capacity = _int(builder, "max_kv_cache_capacity")
    pages_per_seq = -(-capacity // _PAGE)
    pool_pages = b * pages_per_seq
    tree = 1 if role == "llm" else _int(builder, "max_verify_tree_size" if role == "base" else "max_draft_tree_size")
    spec = role != "llm"
    prefill = _Extents((1, b, b), (1, b * max(1, length // 2), b * length), (2, b + 1, b + 1),
                       (1, b * max(1, length // 2), b * length) if spec else (1, b, b))
    gen_tokens = b * tree
    generation = _Extents((1, b, b), (1, gen_tokens, gen_tokens), (2, b + 1, b + 1),
                          (1, gen_tokens, gen_tokens) if spec else (1, b, b))
    block_draft = role == "draft" and spec_type in _BLOCK_DRAFTS
    context = generation if block_draft else prefill
    lora_rank = int(builder.get("max_lora_rank", 0) or 0)

    out: Profiles = {}

    def fixed_dim(name: str, axis: int, fallback: int) -> int:
        shape = inputs.get(name)
        if shape is None:
            return fallback
        value = int(shape[axis])
        return fallback if value < 0 else value

    def put(name: str, ctx: Range, gen: Range | None = None) -> None:
        if name in inputs:
            out[name] = (ctx, gen if gen is not None else ctx)

    for name in ("positions", "vision_block_ids", "attention_position_ids", "tree_parent_ids", "tree_depths"):
        put(name, context.token(), generation.token())
    delta_ctx = (1, b * max(1, length // 2), b * length)
    delta_gen = (1, b * (int(builder.get("max_draft_tree_size", 1) or 1) + 1),
                 b * (int(builder.get("max_draft_tree_size", 1) or 1) + 1))
    for name in ("dflash_delta_positions", "dflash_delta_token_to_sequence"):
        put(name, _span((t,) for t in delta_ctx), _span((t,) for t in delta_gen))
    for name in ("query_lengths", "past_lengths", "attention_sequence_lengths", "state_indices",
                 "valid_tree_counts", "dflash_delta_lengths"):
        put(name, prefill.sequence(), generation.sequence())
    put("query_start_offsets", prefill.offset(), generation.offset())
    put("context_sequence_count_carrier", _fixed((0,)) if block_draft else prefill.sequence(), _fixed((0,)))
    put("logits_indices", _span((r,) for r in prefill.logits_rows), _span((r,) for r in generation.logits_rows))
    gen_phase = {"llm": 3, "draft": 4, "base": 5}[role]
    put("execution_phase_marker", ((1,), (4 if block_draft else 1,), (8,)), ((1,), (gen_phase,), (8,)))
    hidden = int(config.get("hidden_size", 0) or 0)
    for name in ("inputs_embeds", "hidden_states", "hidden_states_from_draft", "hidden_states_input"):
        width = fixed_dim(name, -1, hidden)
        put(name, (context if name == "inputs_embeds" else prefill).token(width), generation.token(width))
    delta_width = fixed_dim("dflash_target_hidden_concat", -1, hidden)
    put("dflash_target_hidden_concat", _span((t, delta_width) for t in delta_ctx),
        _span((t, delta_width) for t in delta_gen))
    for name in ("rope_rotary_cos_sin", "rope_rotary_cos_sin_sliding", "rope_rotary_cos_sin_full"):
        width = fixed_dim(name, -1, 0)
        put(name, context.token(width), generation.token(width))
    width = fixed_dim("dflash_delta_rope_cos_sin", -1, 0)
    put("dflash_delta_rope_cos_sin", _span((t, width) for t in delta_ctx), _span((t, width) for t in delta_gen))
    pool_range = _pool_ranges(config, builder, b, capacity, pool_pages)
    for name, shape in inputs.items():
        if name.startswith("past_key_values_"):
            put(name, pool_range(int(name[len("past_key_values_"):]), int(shape[3]), int(shape[4])))
        elif name.startswith(("conv_state_", "recurrent_state_")):
            put(name, _fixed((b, *(int(d) for d in shape[1:]))))
        elif name.startswith(("deepstack_embeds_", "ple_token_embeds_")):
            put(name, prefill.token(int(shape[-1])), generation.token(int(shape[-1])))
        elif ".lora_A.weight" in name:
            put(name, ((int(shape[0]), 0), (int(shape[0]), lora_rank), (int(shape[0]), lora_rank)))
        elif ".lora_B.weight" in name:
            put(name, ((0, int(shape[1])), (lora_rank, int(shape[1])), (lora_rank, int(shape[1]))))
    put("kv_page_table", ((1, 2, pages_per_seq), (b, 2, pages_per_seq), (b, 2, pages_per_seq)))
    put("swa_kv_page_table", ((1, 2, pages_per_seq), (b, 2, pages_per_seq), (b, 2, pages_per_seq)))
    put("swa_kv_cache_mode", ((0,), (1,), (1,)))
    packed = max(1, (tree + 31) // 32)
    ctx_widths = (1, packed, packed) if block_draft else (1, 1, 1)
    put("packed_attention_mask", _span(zip(context.tokens, ctx_widths)),
        _span(zip(generation.tokens, (1, packed, packed))))
    put("skip_softmax_scale", ((0,), (0,), (capacity,)))
    vocab = int(config.get("vocab_size", 0) or 0)
    lm_width = fixed_dim("lm_head_weight", -1, hidden)
    put("lm_head_weight", ((1, lm_width), (vocab, lm_width), (vocab, lm_width)))

    for name, shape in inputs.items():
        if name in out:
            continue
        dims = tuple(int(d) for d in shape)
        if any(d < 0 for d in dims):
            raise ConfigError(name, f"is a dynamic input ({list(dims)}) Edge-LLM's builder sets no profile for")
        out[name] = (_fixed(dims), _fixed(dims))
    return out


# Inputs that mark a vision encoder _setup_component_profile sizes another way than a Qwen ViT's.
_OTHER_VISUAL = {"pooling_weights": "Gemma 3/4's pooled ViT", "pixel_position_ids": "Gemma 4's unified encoder"}


def visual_profiles(inputs: Mapping[str, Sequence[int]], builder: Mapping[str, Any]) -> Profiles:
    """The one profile of a Qwen2.5-VL / Qwen3-VL vision encoder (``_setup_component_profile``, the visual
    component): each dynamic dimension from ``builder_config``'s ``min_image_tokens``, ``max_image_tokens`` and
    ``max_image_tokens_per_image`` (4 patches a merged token); a static input keeps its graph shape. A 4-D ``input``
    (tiles of pixels) takes ``max(1, min_image_tokens // 256) .. max(1, max_image_tokens // 256)`` tiles, optimum
    their mean, as the builder sets it. Other visual graphs (Gemma's, Muse's patch-level windows) are refused naming
    what marks them."""
    lo, hi = _int(builder, "min_image_tokens"), _int(builder, "max_image_tokens")
    per_image = _int(builder, "max_image_tokens_per_image")
    for name, what in _OTHER_VISUAL.items():
        if name in inputs:
            raise ConfigError(name, f"marks {what}, whose profile this reading of the builder does not give")
    tiles = inputs.get("input", ())
    if len(tiles) == 4:
        few, many = max(1, lo // 256), max(1, hi // 256)
        dims = tuple(int(d) for d in tiles)
        return {"input": ((tuple(few if d < 0 else d for d in dims), tuple((few + many) // 2 if d < 0 else d
                                                                           for d in dims),
                           tuple(many if d < 0 else d for d in dims)),)}
    if "fast_pos_embed_idx" in inputs and "window_index" in inputs:
        raise ConfigError("input", "this visual graph (Muse's patch-level windows) is not a Qwen ViT, whose profile "
                                   "alone this reading of the builder gives")
    patches_per_token = 4
    soft_opt = max(lo, (lo + hi) // 2)
    images = max(2, hi // lo + 1)
    carrier = per_image * patches_per_token

    def extent(name: str) -> tuple[int, int, int]:
        if name in ("cu_seqlens", "kv_lengths"):
            return 2, max(2, images // 2), images
        if name in ("cu_window_seqlens", "kv_lengths_window"):
            return 2, hi, hi
        if name in ("window_index", "reverse_window_index"):
            return lo, (lo + hi) // 2, hi
        if name == "max_seqlen_carrier":
            return 1, max(1, carrier // 2), carrier
        return lo * patches_per_token, soft_opt * patches_per_token, hi * patches_per_token

    out: Profiles = {}
    for name, shape in inputs.items():
        dims = tuple(int(d) for d in shape)
        if -1 not in dims:
            out[name] = (_fixed(dims),)
            continue
        low, opt, high = extent(name)
        out[name] = ((tuple(low if d < 0 else d for d in dims), tuple(opt if d < 0 else d for d in dims),
                      tuple(high if d < 0 else d for d in dims)),)
    return out


def audio_profiles(inputs: Mapping[str, Sequence[int]], builder: Mapping[str, Any]) -> Profiles:
    """The one profile of a Qwen3-ASR / Qwen3-Omni audio encoder (``_setup_component_profile``, the audio
    component), from ``builder_config``'s ``min_time_steps`` / ``max_time_steps``: ``padded_feature``'s chunks
    ``ceil(steps / chunk)``, the rows of ``padded_mask_after_cnn_indices`` and ``attention_mask`` from that many chunks
    up to ``(chunk + 7) // 8`` rows a chunk, ``cu_seqlens`` ``1 .. max_time_steps // 100``, and any other dynamic
    dimension (``kv_lengths`` among them) ``min_time_steps .. max_time_steps``, as the builder sets them."""
    lo, hi = _int(builder, "min_time_steps"), _int(builder, "max_time_steps")
    window = int(inputs["padded_feature"][-1])
    chunks_lo, chunks_hi = max(1, -(-lo // window)), max(1, -(-hi // window))
    tokens_hi = chunks_hi * ((window + 7) // 8)

    def extent(name: str) -> tuple[int, int, int]:
        if name == "padded_feature":
            return chunks_lo, (chunks_lo + chunks_hi) // 2, chunks_hi
        if name in ("padded_mask_after_cnn_indices", "attention_mask"):
            return chunks_lo, (chunks_lo + tokens_hi) // 2, tokens_hi
        if name in ("n_window", "cu_seqlens"):
            return 1, max(1, hi // 200), max(1, hi // 100)
        return lo, (lo + hi) // 2, hi

    out: Profiles = {}
    for name, shape in inputs.items():
        dims = tuple(int(d) for d in shape)
        if -1 not in dims:
            out[name] = (_fixed(dims),)
            continue
        low, opt, high = extent(name)
        out[name] = ((tuple(low if d < 0 else d for d in dims), tuple(opt if d < 0 else d for d in dims),
                      tuple(high if d < 0 else d for d in dims)),)
    return out
