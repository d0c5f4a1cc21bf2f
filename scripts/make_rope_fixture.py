"""Compute Hugging Face transformers' RoPE numbers once, for trtio's tests.

Writes ``tests/fixtures/rope/hf_rope.json``: for each case, the config it came from, the inverse
frequencies and attention factor transformers uses, and the cos/sin its rotary embedding class
returns at a set of positions. transformers and torch are not test dependencies: run this by hand,
in a scratch virtual environment outside the repository, from the repository root::

    VENV="$(mktemp -d)/rope-venv"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install transformers==5.18.0 torch==2.13.0
    "$VENV/bin/python" scripts/make_rope_fixture.py

The output records the transformers and torch versions used. Each case builds a tiny config of a
real model class (Llama, Phi-3, DeepSeek-V3, gpt-oss, Qwen3-Next, Qwen2.5-VL, Qwen3-VL) the way a config.json
would, runs the model's rotary embedding on a fresh module (so ``dynamic`` and ``longrope`` see the
sequence length ``max(positions) + 1``), and checks that ``ROPE_INIT_FUNCTIONS`` gives the same
inverse frequencies for that length.
"""

from __future__ import annotations

import argparse
import base64
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
import transformers
from transformers import (
    DeepseekV3Config,
    GptOssConfig,
    LlamaConfig,
    Phi3Config,
    Qwen2_5_VLTextConfig,
    Qwen3NextConfig,
    Qwen3VLTextConfig,
)
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3RotaryEmbedding
from transformers.models.gpt_oss.modeling_gpt_oss import GptOssRotaryEmbedding
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding
from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLRotaryEmbedding
from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextRotaryEmbedding
from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextRotaryEmbedding

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "rope" / "hf_rope.json"

# Small positions exercise every frequency near zero; the large ones are where the scaling types
# differ (past llama3's and yarn's original lengths, past dynamic's and longrope's thresholds).
SMALL = list(range(32)) + [63]

# Phi-3-vision-128k-instruct's LongRoPE factors (48 = head_dim 96 / 2), as shipped in its config.json.
PHI3_LONG = [
    1.0299999713897705, 1.0499999523162842, 1.0499999523162842, 1.0799999237060547, 1.2299998998641968,
    1.2299998998641968, 1.2999999523162842, 1.4499999284744263, 1.5999999046325684, 1.6499998569488525,
    1.8999998569488525, 2.859999895095825, 3.68999981880188, 5.419999599456787, 5.489999771118164,
    5.489999771118164, 9.09000015258789, 11.579999923706055, 15.65999984741211, 15.769999504089355,
    15.789999961853027, 18.360000610351562, 21.989999771118164, 23.079999923706055, 30.009998321533203,
    32.35000228881836, 32.590003967285156, 35.56000518798828, 39.95000457763672, 53.840003967285156,
    56.20000457763672, 57.95000457763672, 59.29000473022461, 59.77000427246094, 59.920005798339844,
    61.190006256103516, 61.96000671386719, 62.50000762939453, 63.3700065612793, 63.48000717163086,
    63.48000717163086, 63.66000747680664, 63.850006103515625, 64.08000946044922, 64.760009765625,
    64.80001068115234, 64.81001281738281, 64.81001281738281,
]
PHI3_SHORT = [
    1.05, 1.05, 1.05, 1.1, 1.1, 1.1, 1.2500000000000002, 1.2500000000000002, 1.4000000000000004,
    1.4500000000000004, 1.5500000000000005, 1.8500000000000008, 1.9000000000000008, 2.000000000000001,
    2.000000000000001, 2.000000000000001, 2.000000000000001, 2.000000000000001, 2.000000000000001,
    2.000000000000001, 2.000000000000001, 2.000000000000001, 2.000000000000001, 2.000000000000001,
    2.000000000000001, 2.000000000000001, 2.000000000000001, 2.000000000000001, 2.000000000000001,
    2.000000000000001, 2.000000000000001, 2.000000000000001, 2.1000000000000005, 2.1000000000000005, 2.2,
    2.3499999999999996, 2.3499999999999996, 2.3499999999999996, 2.3499999999999996, 2.3999999999999995,
    2.3999999999999995, 2.6499999999999986, 2.6999999999999984, 2.8999999999999977, 2.9499999999999975,
    3.049999999999997, 3.049999999999997, 3.049999999999997,
]

MODELS: dict[str, tuple[Any, Any]] = {
    "llama": (LlamaConfig, LlamaRotaryEmbedding),
    "phi3": (Phi3Config, Phi3RotaryEmbedding),
    "deepseek_v3": (DeepseekV3Config, DeepseekV3RotaryEmbedding),
    "gpt_oss": (GptOssConfig, GptOssRotaryEmbedding),
    "qwen2_5_vl": (Qwen2_5_VLTextConfig, Qwen2_5_VLRotaryEmbedding),
    "qwen3_next": (Qwen3NextConfig, Qwen3NextRotaryEmbedding),
    "qwen3_vl": (Qwen3VLTextConfig, Qwen3VLTextRotaryEmbedding),
}


def _llama(head_dim: int, theta: float, max_pos: int, rope_scaling: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "hidden_size": head_dim * 2, "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": head_dim,
        "num_hidden_layers": 1, "intermediate_size": 8, "vocab_size": 200000,
        "max_position_embeddings": max_pos, "rope_theta": theta, "rope_scaling": rope_scaling,
    }


def _mrope_positions() -> list[list[int]]:
    """Distinct temporal, height and width ids, as Qwen-VL's get_rope_index makes for text+image+text."""
    t = list(range(8)) + [8] * 12 + list(range(11, 23)) + [1000, 8191, 40000]
    h = list(range(8)) + [8 + i // 4 for i in range(12)] + list(range(11, 23)) + [1000, 8191, 39990]
    w = list(range(8)) + [8 + i % 4 for i in range(12)] + list(range(11, 23)) + [1000, 8191, 39999]
    return [t, h, w]


def cases() -> list[dict[str, Any]]:
    """Each case: name, model family, config.json fields, and the positions to evaluate."""
    big = [1000, 4095, 4096, 8191, 40000]
    return [
        {"name": "default_llama3_8b", "model": "llama", "positions": SMALL + big,
         "config": _llama(128, 500000.0, 8192, None)},
        {"name": "linear_factor2", "model": "llama", "positions": SMALL + [1000, 4095, 8191],
         "config": _llama(128, 10000.0, 4096, {"type": "linear", "factor": 2.0})},
        {"name": "dynamic_factor2_below_original", "model": "llama", "positions": SMALL + [1000, 2047],
         "config": _llama(128, 10000.0, 4096, {"type": "dynamic", "factor": 2.0})},
        {"name": "dynamic_factor2_above_original", "model": "llama", "positions": SMALL + [1000, 4095, 8191],
         "config": _llama(128, 10000.0, 4096, {"type": "dynamic", "factor": 2.0})},
        {"name": "llama3_llama31_8b", "model": "llama", "positions": SMALL + big,
         "config": _llama(128, 500000.0, 131072, {
             "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
             "original_max_position_embeddings": 8192})},
        {"name": "yarn_qwen25_factor4", "model": "llama", "positions": SMALL + big,
         "config": _llama(128, 1000000.0, 131072, {
             "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768})},
        {"name": "yarn_deepseek_v3_mscale", "model": "deepseek_v3", "positions": SMALL + big,
         "config": {
             "hidden_size": 64, "num_attention_heads": 2, "num_key_value_heads": 2, "num_hidden_layers": 1,
             "intermediate_size": 8, "moe_intermediate_size": 8, "vocab_size": 200000, "q_lora_rank": 16,
             "kv_lora_rank": 16, "qk_rope_head_dim": 64, "qk_nope_head_dim": 32, "v_head_dim": 32,
             "max_position_embeddings": 163840, "rope_theta": 10000.0,
             "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
                              "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}}},
        # Not a shipped model: mscale != mscale_all_dim so the ratio of the two mscale terms is not 1.
        {"name": "yarn_mscale_unequal", "model": "llama", "positions": SMALL + big,
         "config": _llama(64, 10000.0, 163840, {
             "rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096,
             "mscale": 1.0, "mscale_all_dim": 0.707})},
        {"name": "yarn_gpt_oss_no_truncate", "model": "gpt_oss", "positions": SMALL + big,
         "config": {
             "hidden_size": 128, "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 64,
             "num_hidden_layers": 1, "intermediate_size": 8, "vocab_size": 200000, "num_local_experts": 2,
             "max_position_embeddings": 131072, "rope_theta": 150000.0,
             "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                              "truncate": False, "original_max_position_embeddings": 4096}}},
        # Not a shipped model: beta_slow's correction dimension (37) lies past rotary_dim / 2, where HF
        # clamps the ramp's end at rotary_dim - 1, not rotary_dim / 2 - 1.
        {"name": "yarn_ramp_past_half", "model": "llama", "positions": SMALL + big,
         "config": _llama(64, 10000.0, 524288, {
             "rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 65536, "beta_slow": 0.25})},
        # Qwen3-Next's shape (head_dim 256, partial_rotary_factor 0.25 -> rotary_dim 64) with its documented yarn.
        {"name": "yarn_qwen3_next_partial", "model": "qwen3_next", "positions": SMALL + big,
         "config": {
             "hidden_size": 512, "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 256,
             "num_hidden_layers": 1, "intermediate_size": 8, "vocab_size": 200000, "num_experts": 2,
             "max_position_embeddings": 1048576, "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
             "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 262144}}},
        {"name": "longrope_phi3_short", "model": "phi3", "positions": SMALL + [1000, 4095],
         "config": {
             "hidden_size": 192, "num_attention_heads": 2, "num_key_value_heads": 2, "num_hidden_layers": 1,
             "intermediate_size": 8, "vocab_size": 200000, "max_position_embeddings": 131072,
             "original_max_position_embeddings": 4096, "rope_theta": 10000.0,
             "rope_scaling": {"type": "longrope", "long_factor": PHI3_LONG, "short_factor": PHI3_SHORT}}},
        {"name": "longrope_phi3_long", "model": "phi3", "positions": SMALL + [1000, 4095, 4096, 8191],
         "config": {
             "hidden_size": 192, "num_attention_heads": 2, "num_key_value_heads": 2, "num_hidden_layers": 1,
             "intermediate_size": 8, "vocab_size": 200000, "max_position_embeddings": 131072,
             "original_max_position_embeddings": 4096, "rope_theta": 10000.0,
             "rope_scaling": {"type": "longrope", "long_factor": PHI3_LONG, "short_factor": PHI3_SHORT}}},
        # Phi-4-mini's shape (head_dim 128, partial_rotary_factor 0.75 -> rotary_dim 96); Phi-3's factor lists.
        {"name": "longrope_phi4_mini_partial", "model": "phi3", "positions": SMALL + [1000, 4095, 8191, 40000],
         "config": {
             "hidden_size": 256, "num_attention_heads": 2, "num_key_value_heads": 2, "num_hidden_layers": 1,
             "intermediate_size": 8, "vocab_size": 200000, "max_position_embeddings": 131072,
             "original_max_position_embeddings": 4096, "rope_theta": 10000.0, "partial_rotary_factor": 0.75,
             "rope_scaling": {"rope_type": "longrope", "long_factor": PHI3_LONG, "short_factor": PHI3_SHORT}}},
        {"name": "mrope_qwen25_vl", "model": "qwen2_5_vl", "mrope_positions": _mrope_positions(),
         "config": {**_llama(128, 1000000.0, 128000, {"type": "mrope", "mrope_section": [16, 24, 24]})}},
        {"name": "mrope_interleaved_qwen3_vl", "model": "qwen3_vl", "mrope_positions": _mrope_positions(),
         "config": {**_llama(128, 5000000.0, 262144, {
             "rope_type": "default", "mrope_section": [24, 20, 20], "mrope_interleaved": True})}},
    ]


def _b64(a: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(a, dtype="<f4").tobytes()).decode("ascii")


def _half(t: torch.Tensor, half: int) -> np.ndarray:
    """HF returns [cos | cos] (or just cos for gpt-oss); keep one copy and check the other equals it."""
    a = t.detach().numpy().reshape(-1, t.shape[-1])
    if a.shape[1] == 2 * half:
        assert np.array_equal(a[:, :half], a[:, half:]), "HF's two halves differ"
    else:
        assert a.shape[1] == half, a.shape
    return a[:, :half]


def run_case(case: dict[str, Any]) -> dict[str, Any]:
    config_cls, rotary_cls = MODELS[case["model"]]
    raw = json.loads(json.dumps(case["config"]))  # HF edits the dicts it is given
    config = config_cls(**raw)
    rotary = rotary_cls(config)
    if "mrope_positions" in case:
        pos = torch.tensor(case["mrope_positions"], dtype=torch.int64)[:, None, :]  # [3, batch 1, N]
        seq_len = int(pos.max()) + 1
    else:
        pos = torch.tensor(case["positions"], dtype=torch.int64)[None, :]
        seq_len = int(pos.max()) + 1
    cos, sin = rotary(torch.zeros(1, dtype=torch.float32), pos)
    inv_freq = rotary.inv_freq.detach().double().numpy()
    half = inv_freq.shape[0]
    params = dict(config.rope_parameters)
    rope_type = params["rope_type"]
    if rope_type != "default":
        init_inv, init_att = ROPE_INIT_FUNCTIONS[rope_type](config, None, seq_len=seq_len)
        np.testing.assert_allclose(init_inv.double().numpy(), inv_freq, rtol=1e-6)
        assert math.isclose(float(init_att), float(rotary.attention_scaling), rel_tol=1e-12)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return {
        "name": case["name"],
        "hf_class": rotary_cls.__name__,
        "config": case["config"],
        "hf_rope_parameters": params,
        "head_dim": int(head_dim),
        "rotary_dim": 2 * half,
        "rope_theta": float(params["rope_theta"]),
        "max_position_embeddings": int(config.max_position_embeddings),
        "positions": case.get("positions"),
        "mrope_positions": case.get("mrope_positions"),
        "seq_len": seq_len,
        "inv_freq": [float(x) for x in inv_freq],
        "attention_factor": float(rotary.attention_scaling),
        "angle_dtype": "float32",
        "cos": _b64(_half(cos, half)),
        "sin": _b64(_half(sin, half)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    torch.set_default_dtype(torch.float32)
    data = {
        "about": "RoPE numbers from Hugging Face transformers, made by scripts/make_rope_fixture.py",
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "layout": "cos and sin: base64 of little-endian float32 [len(positions), rotary_dim / 2]; "
                  "HF repeats the same values in the second half of each row",
        "cases": [run_case(c) for c in cases()],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes, {len(data['cases'])} cases)")


if __name__ == "__main__":
    main()
