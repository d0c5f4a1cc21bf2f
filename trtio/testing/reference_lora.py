"""The toy model with LoRA inputs: what a :class:`~trtio.testing.ReferenceEngine` of a config with
``max_lora_rank > 0`` declares and computes, and the toy adapters the tests and the toy LoRA directory use.

Every linear layer of an attention layer ``l`` takes an adapter (``docs/toy-model.md``'s weights): module
``model.layers.{l}.self_attn.q_proj`` (``wq``), ``k_proj`` (``wk``), ``v_proj`` (``wv``), ``o_proj`` (``wo``),
``model.layers.{l}.mlp.up_proj`` (``w1``) and ``mlp.down_proj`` (``w2``); the LM head takes none, as in
Edge-LLM. Each module declares ``{module}.lora_A.weight`` FP16 ``[in, r]`` and ``{module}.lora_B.weight`` FP16
``[r, out]``, the rank ``r`` from 0 to ``max_lora_rank`` on both profiles, and the layer computes
``x @ W + (x @ A) @ B`` (A and B widened to float32; rank 0 adds nothing). :func:`merged_weights` is the same
model with ``W + A @ B`` as its weights, which the tests compare against.

``naming="nodes"`` declares the inputs as Edge-LLM 0.11's ``insert-lora`` names them on an export whose weights
are anonymous (``ode_linear.lora_A.weight``, ``ode_linear_1...``): trtio binds them at rank 0 and refuses an adapter,
and the engine computes the model without LoRA.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from trtio._dtypes import DType
from trtio.errors import InvalidValueError
from trtio.families.lora.adapters import LORA_A, LORA_B, LoraAdapter
from trtio.testing.toy_model import ToyWeights

__all__ = ["LORA_PROJECTIONS", "lora_declarations", "lora_modules", "lora_pairs", "merged_weights", "toy_adapter"]

#: The toy's weights that take an adapter, with their module names (after ``model.layers.{l}.``).
LORA_PROJECTIONS = {"wq": "self_attn.q_proj", "wk": "self_attn.k_proj", "wv": "self_attn.v_proj",
                    "wo": "self_attn.o_proj", "w1": "mlp.up_proj", "w2": "mlp.down_proj"}
Shape = tuple[int, ...]
Profiles = tuple[tuple[Shape, Shape, Shape], ...]


def lora_modules(cfg: Any, layout: str = "toy") -> list[tuple[str, int, str, int, int]]:
    """(module, layer, toy weight, in, out) of every module of ``cfg`` that takes an adapter, in layer order.

    ``layout="edgellm"``: the modules of a dense Edge-LLM LLM instead (what a null-compute engine declares, so that
    dry runs and ``trtio plan`` size the buffers of a real engine): per layer a fused ``self_attn.qkv_proj``
    (``hidden -> (heads + 2 kv heads) x head_dim``), ``self_attn.o_proj``, ``mlp.gate_proj`` and ``mlp.up_proj``
    (``hidden -> intermediate_size``, the config's, else 2 x hidden) and ``mlp.down_proj``, the widths of
    ``tests/fixtures/edgellm-0.11/qwen3-lora``'s graph (the toy weight is ``""``: nothing computes them)."""
    h = int(cfg.hidden_size)
    hq, hkv, d = int(cfg.num_attention_heads), int(cfg.num_kv_heads), int(cfg.head_dim)
    layers = range(int(cfg.num_attention_layers))
    if layout == "edgellm":
        extras = getattr(cfg, "extras", None) or {}
        inter = extras.get("intermediate_size")
        f = int(inter) if isinstance(inter, int) and inter > 0 else 2 * h
        real = {"self_attn.qkv_proj": (h, (hq + 2 * hkv) * d), "self_attn.o_proj": (hq * d, h),
                "mlp.gate_proj": (h, f), "mlp.up_proj": (h, f), "mlp.down_proj": (f, h)}
        return [(f"model.layers.{layer}.{module}", layer, "", *io) for layer in layers for module, io in real.items()]
    widths = {"wq": (h, hq * d), "wk": (h, hkv * d), "wv": (h, hkv * d), "wo": (hq * d, h), "w1": (h, 2 * h),
              "w2": (2 * h, h)}
    return [(f"model.layers.{layer}.{module}", layer, key, *widths[key])
            for layer in layers for key, module in LORA_PROJECTIONS.items()]


def lora_declarations(cfg: Any, naming: str = "modules",
                      layout: str = "toy") -> list[tuple[str, DType, Shape, Profiles]]:
    """The LoRA inputs a reference engine of ``cfg`` declares (name, dtype, shape, profiles) for the modules of
    ``layout`` (:func:`lora_modules`); none where ``cfg.max_lora_rank`` is 0."""
    rank = int(getattr(cfg, "max_lora_rank", 0) or 0)
    if not rank:
        return []
    if naming not in ("modules", "nodes"):
        raise InvalidValueError(f"ReferenceEngine: lora_naming must be 'modules' or 'nodes', got {naming!r}")
    out: list[tuple[str, DType, Shape, Profiles]] = []
    for i, (module, _layer, _key, n_in, n_out) in enumerate(lora_modules(cfg, layout)):
        name = module if naming == "modules" else ("ode_linear" if i == 0 else f"ode_linear_{i}")
        a: tuple[Shape, Shape, Shape] = ((n_in, 0), (n_in, rank), (n_in, rank))
        b: tuple[Shape, Shape, Shape] = ((0, n_out), (rank, n_out), (rank, n_out))
        out.append((name + LORA_A, DType.FLOAT16, (n_in, -1), (a, a)))
        out.append((name + LORA_B, DType.FLOAT16, (-1, n_out), (b, b)))
    return out


def lora_pairs(cfg: Any, load: Any, views: Mapping[str, Any]) -> tuple[dict[str, tuple[Any, Any]], ...]:
    """Per attention layer, toy weight -> (A, B) as float32 arrays (``load(view)`` widens a bound FP16 view) for
    every module bound with a rank above 0."""
    layers: list[dict[str, tuple[Any, Any]]] = [{} for _ in range(int(cfg.num_attention_layers))]
    for module, layer, key, _n_in, _n_out in lora_modules(cfg):
        a = views.get(module + LORA_A)
        if a is not None and a.shape[1]:
            layers[layer][key] = (load(a), load(views[module + LORA_B]))
    return tuple(layers)


def merged_weights(weights: ToyWeights, cfg: Any, adapter: LoraAdapter | None) -> ToyWeights:
    """``weights`` with each adapted module's ``W + A @ B`` (A and B as float32): the model an engine bound to
    ``adapter`` computes. ``adapter=None``: ``weights`` as they are."""
    if adapter is None:
        return weights
    per_key: dict[str, list[np.ndarray]] = {key: list(getattr(weights, key)) for key in LORA_PROJECTIONS}
    for module, layer, key, _n_in, _n_out in lora_modules(cfg):
        pair = adapter.weights.get(module)
        if pair is not None:
            a, b = (np.asarray(x, np.float32) for x in pair)
            per_key[key][layer] = per_key[key][layer] + a @ b
    merged: dict[str, Any] = {k: tuple(v) for k, v in per_key.items()}
    return dataclasses.replace(weights, **merged)


def toy_adapter(cfg: Any, rank: int, *, seed: int = 0, name: str | None = None,
                modules: tuple[str, ...] | None = None, scale: float = 0.5) -> LoraAdapter:
    """A seeded FP16 adapter of ``rank`` for ``cfg``'s modules (``modules``: those whose names end with one of
    these, e.g. ``("q_proj", "v_proj")``; default every one). ``A @ B`` is about ``scale`` times the size of
    ``W``, so an adapter visibly changes the logits."""
    rng = np.random.default_rng(seed)
    out = {}
    for module, _layer, _key, n_in, n_out in lora_modules(cfg):
        if modules is not None and not module.endswith(modules):
            continue
        a = rng.standard_normal((n_in, rank)) / np.sqrt(n_in)
        b = rng.standard_normal((rank, n_out)) * (scale / np.sqrt(rank))
        out[module] = (a.astype(np.float16), b.astype(np.float16))
    return LoraAdapter.from_arrays(out, name=name if name is not None else f"toy-r{rank}-s{seed}")
