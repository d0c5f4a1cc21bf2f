"""``trt_edgellm::Fp16MoePlugin`` (softmax top-k routing, SwiGLU experts) in numpy, read from Edge-LLM 0.11's C++.

Sources: ``cpp/plugins/fp16MoePlugin/fp16MoePlugin.cpp`` (inputs ``router_logits [T, E]`` fp32, ``hidden_states
[T, H]`` half, ``fc1_weights [E, FC1_N, H]``, ``fc2_weights [E, H, I]``; ``enqueue``: ``moeTopkSoftmax`` then the
grouped expert GEMMs), ``cpp/kernels/moe/moeTopkSoftmaxKernels.h`` (softmax over every expert in fp32, the top-k
kept, renormalised to sum 1 where ``norm_topk_prob``), and the exporter's FC1 layout
(``tensorrt_edgellm/models/qwen3_moe/modeling_qwen3_moe.py::_prepare_fp16_moe_weights``: 64-row chunks
``[up 0:64, gate 0:64, up 64:128, gate 64:128, ...]``; SwiGLU = ``silu(gate) * up``).

The plugin's build-time limits (``validateAttributes``: 128 or 256 experts, a hidden size that is a multiple of 128,
an intermediate size that is a multiple of 64) are not enforced here: a parity fixture small enough to commit has
fewer experts, so no real engine builds from it (:func:`build_limits` names what a real build would refuse). What a
real plugin checks at run time is checked.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from trtio.testing.edgellm_plugins._common import PluginInputError

__all__ = ["build_limits", "fp16_moe_plugin"]

_SWIGLU, _RELU2 = 2, 4
_CHUNK = 64


def build_limits(attrs: dict[str, Any]) -> list[str]:
    """What ``validateAttributes`` would refuse when building a real engine with these attributes."""
    found = []
    if int(attrs["num_experts"]) not in (128, 256):
        found.append(f"num_experts {attrs['num_experts']} (the plugin builds for 128 or 256)")
    if int(attrs["hidden_size"]) % 128:
        found.append(f"hidden_size {attrs['hidden_size']} (a multiple of 128)")
    if int(attrs["moe_inter_size"]) % 64:
        found.append(f"moe_inter_size {attrs['moe_inter_size']} (a multiple of 64)")
    return found


def fp16_moe_plugin(node: str, inputs: tuple[np.ndarray, ...], attrs: dict[str, Any]) -> tuple[np.ndarray, ...]:
    """One Fp16MoePlugin node: the routed experts' weighted sum ``[T, H]`` half."""
    plugin = f"Fp16MoePlugin {node}"
    if int(attrs.get("routing_mode", 0) or 0) != 0:
        raise PluginInputError(f"{plugin}: routing_mode {attrs['routing_mode']} (sigmoid group top-k) is a mode "
                               "this numpy model does not compute")
    if len(inputs) != 4:
        raise PluginInputError(f"{plugin}: expected 4 inputs (softmax top-k routing), got {len(inputs)}")
    router, hidden, fc1, fc2 = (np.asarray(x) for x in inputs)
    experts, top_k, width = int(attrs["num_experts"]), int(attrs["top_k"]), int(attrs["hidden_size"])
    inter, activation = int(attrs["moe_inter_size"]), int(attrs["activation_type"])
    if activation not in (_SWIGLU, _RELU2):
        raise PluginInputError(f"{plugin}: activation_type {activation} is not 2 (SwiGLU) or 4 (ReLU2)")
    fc1_rows = 2 * inter if activation == _SWIGLU else inter
    tokens = hidden.shape[0] if hidden.ndim == 2 else -1
    if hidden.ndim != 2 or hidden.shape[1] != width or router.shape != (tokens, experts):
        raise PluginInputError(f"{plugin}: invalid runtime hidden/router dimensions: hidden {list(hidden.shape)}, "
                               f"router {list(router.shape)} (expected [T, {width}] and [T, {experts}])")
    if fc1.shape != (experts, fc1_rows, width) or fc2.shape != (experts, width, inter):
        raise PluginInputError(f"{plugin}: fc1 {list(fc1.shape)} / fc2 {list(fc2.shape)} are not "
                               f"[{experts}, {fc1_rows}, {width}] / [{experts}, {width}, {inter}]")
    logits = router.astype(np.float32)
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    top = np.argsort(-probs, axis=1, kind="stable")[:, :top_k]
    weights = np.take_along_axis(probs, top, axis=1)
    if int(attrs["norm_topk_prob"]):
        weights /= weights.sum(axis=1, keepdims=True)
    x = hidden.astype(np.float32)
    out = np.zeros((tokens, width), np.float32)
    for e in np.unique(top):
        rows, slot = np.nonzero(top == e)
        h = x[rows] @ fc1[e].astype(np.float32).T  # [rows, FC1_N]
        if activation == _SWIGLU:
            chunks = h.reshape(len(rows), inter // _CHUNK, 2, _CHUNK)
            up, gate = chunks[:, :, 0].reshape(len(rows), inter), chunks[:, :, 1].reshape(len(rows), inter)
            act = (gate / (1.0 + np.exp(-gate)) * up).astype(np.float16)
        else:
            act = np.square(np.maximum(h, 0.0)).astype(np.float16)
        y = act.astype(np.float32) @ fc2[e].astype(np.float32).T  # [rows, H]
        out[rows] += weights[rows, slot][:, None] * y
    return (out.astype(np.float16),)
