"""Gemma 4 MTP: a Gemma 4 text target and a ``Gemma4AssistantForCausalLM`` draft, exported as a pair with
``--mtp --mtp-draft-dir`` (Edge-LLM 0.11's ``gemma4_mtp``: ``llm/`` the base, ``mtp_draft/`` the KV-less draft).

The target is the Gemma 4 case's shape (sliding S S F S S F, layers 4-5 reading the KV of layers 3 and 2, PLE,
dual RoPE, logit softcapping) with a window of 64 (every sequence here is shorter: the assistant's sliding mask
is not crossed). The assistant (two layers, S and F, hidden 32, ``backbone_hidden_size`` 64, ordered embeddings
over 8 centroids, top 2) reads the target's KV: its layer 0 the pool of target layer 3, its layer 1 the pool of
target layer 2 (the exporter's ``kv_sharing_map``: the nearest layer of the same kind before the shared suffix).
Both checkpoints carry the same ``tokenizer.json`` (a word-level map of the 512 ids: the exporter checks that the
two maps are equal).

The references (``reference.npz``), all fp32:

* Hugging Face's logits of the target (``Gemma4ForCausalLM``) on each prompt and its greedy continuation, every row
  from the prompt's last token on (``logits_i``), the greedy rows keeping a top-1/top-2 gap of at least ``GAP``;
* the assistant's chain for every committed length ``c`` (``c`` tokens in the target's KV, the pending token
  ``tokens[c]``): ``DEPTH`` steps of ``Gemma4AssistantForCausalLM`` with ``shared_kv_states`` the target's over
  ``tokens[:c]``, step 0 fed ``[embedding(tokens[c]) | hidden(c - 1)]`` (the target's embedding, its last hidden
  state after the final norm at the last committed token), step ``k`` fed the embedding of step ``k - 1``'s argmax
  and its output hidden state, every step at position ``c - 1`` (Edge-LLM's ``gemma4MTPDecoder.cpp``: positions
  ``committed_len - 1``; Hugging Face's own candidate generator puts the query at ``c``: see
  ``docs/edgellm-assumptions.md`` §18.3): ``draft_logits_i [c - prompt, DEPTH, V]`` and the argmax chain
  ``draft_tokens_i [c - prompt, DEPTH]``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from make_parity_fixtures import Case, Role, Sequence, draw, gap, load_hf, save_checkpoint, seeded_model

VOCAB, WINDOW = 512, 64
CONTINUATION = 12
DEPTH = 3  # draft steps a round
VERIFY_SIZE = DEPTH + 1
BUILDER = {"max_batch_size": 2, "max_input_len": 64, "max_kv_cache_capacity": 256}
BASE_BUILDER = {**BUILDER, "max_verify_tree_size": 2 * DEPTH + 1}
DRAFT_BUILDER = {**BUILDER, "max_draft_tree_size": VERIFY_SIZE}
SEQUENCES = (Sequence("spec", 9), Sequence("spec", 17))
_S, _F = "sliding_attention", "full_attention"


def _target_config() -> Any:
    from transformers import Gemma4TextConfig

    return Gemma4TextConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
                            num_attention_heads=4, num_key_value_heads=1, head_dim=32, global_head_dim=64,
                            layer_types=[_S, _S, _F, _S, _S, _F], sliding_window=WINDOW, num_kv_shared_layers=2,
                            vocab_size_per_layer_input=VOCAB, hidden_size_per_layer_input=8,
                            final_logit_softcapping=30.0, max_position_embeddings=2048, initializer_range=0.2)


def checkpoint(folder: Path, seed: int) -> None:
    """The target and the assistant (seeded, fp16 values; the assistant's token ordering a seeded permutation), each
    with the same word-level ``tokenizer.json``."""
    import torch
    from transformers import Gemma4AssistantConfig, Gemma4AssistantForCausalLM, Gemma4ForCausalLM, Gemma4TextConfig

    save_checkpoint(seeded_model(Gemma4ForCausalLM, _target_config(), seed), folder / "base")
    text = Gemma4TextConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=1, head_dim=32, global_head_dim=64,
                            layer_types=[_S, _F], sliding_window=WINDOW, num_kv_shared_layers=2,
                            vocab_size_per_layer_input=0, hidden_size_per_layer_input=0,
                            max_position_embeddings=2048, initializer_range=0.2)
    config = Gemma4AssistantConfig(text_config=text, backbone_hidden_size=64, use_ordered_embeddings=True,
                                   num_centroids=8, centroid_intermediate_top_k=2)
    model = seeded_model(Gemma4AssistantForCausalLM, config, seed + 1)
    order = np.random.default_rng(seed + 2).permutation(VOCAB)
    model.masked_embedding.token_ordering.copy_(torch.from_numpy(order))
    save_checkpoint(model, folder / "draft")
    tokenizer = {"version": "1.0", "added_tokens": [],
                 "model": {"type": "WordLevel", "vocab": {f"t{i}": i for i in range(VOCAB)}, "unk_token": "t0"}}
    for role in ("base", "draft"):
        (folder / role / "tokenizer.json").write_text(json.dumps(tokenizer))


def export(ckpt: Path, out: Path) -> None:
    import subprocess
    import sys

    exe = Path(sys.executable).with_name("tensorrt-edgellm-export")
    args = [ckpt / "base", out, "--mtp", "--mtp-draft-dir", ckpt / "draft"]
    done = subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"tensorrt-edgellm-export failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")


def _assistant(folder: Path) -> Any:
    import torch
    from transformers import Gemma4AssistantForCausalLM

    return Gemma4AssistantForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def draft_chain(target: Any, assistant: Any, tokens: np.ndarray, c: int, depth: int = DEPTH,
                position: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The assistant's ``depth`` greedy steps once ``c`` tokens are committed (module docstring): logits
    ``[depth, V]`` and the argmax tokens ``[depth]``; ``position`` the query position (``c - 1``: Edge-LLM's)."""
    import torch

    with torch.no_grad():
        out = target.model(torch.tensor(tokens[:c], dtype=torch.long)[None], return_shared_kv_states=True)
        shared = {k: (v[0], v[1]) for k, v in out.shared_kv_states.items()}
        hidden = out.last_hidden_state[:, c - 1:c]
        embed = target.get_input_embeddings()
        token = torch.tensor([[int(tokens[c])]])
        pos = torch.tensor([[c - 1 if position is None else position]])
        logits, chain = [], []
        for _ in range(depth):
            step = assistant(inputs_embeds=torch.cat([embed(token), hidden], dim=-1), position_ids=pos,
                             shared_kv_states=shared, use_cache=False)
            row = step.logits[0, -1].float()
            logits.append(row.numpy())
            token = row.argmax().reshape(1, 1)
            chain.append(int(token))
            hidden = step.last_hidden_state
    return np.array(logits, np.float32), np.array(chain, np.int32)


def reference(case: Case, ckpt: Path, out: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    del out
    target = load_hf(ckpt / "base")
    assistant = _assistant(ckpt / "draft")
    arrays: dict[str, np.ndarray] = {}
    sequences = []
    for i, seq in enumerate(case.sequences):
        tokens, logits = draw(target, VOCAB, seq.length, np.random.default_rng(case.seed * 1000 + i),
                              tries=4000, continuation=CONTINUATION)
        n, length = len(tokens), seq.length
        rows = np.arange(length - 1, n - 1, dtype=np.int32)
        arrays[f"tokens_{i}"], arrays[f"positions_{i}"] = tokens, rows
        arrays[f"logits_{i}"] = logits[rows].astype(np.float32)
        chains = [draft_chain(target, assistant, tokens, c) for c in range(length, n - DEPTH)]
        arrays[f"draft_logits_{i}"] = np.array([c[0] for c in chains], np.float32)
        arrays[f"draft_tokens_{i}"] = np.array([c[1] for c in chains], np.int32)
        greedy = logits[length - 1:n - 1]
        sequences.append({"purpose": seq.purpose, "prompt_length": length, "marks": [],
                          "smallest_greedy_gap": round(min(gap(r) for r in greedy), 4),
                          "smallest_draft_gap": round(min(gap(r) for c in chains for r in c[0]), 4)})
    meta = {"sequences": sequences, "continuation": CONTINUATION,
            "spec": {"draft_step": DEPTH, "verify_size": VERIFY_SIZE, "kv_sharing_map": {"0": 3, "1": 2}}}
    return arrays, meta


NOTES = """Exported by one run of the real exporter: `tensorrt-edgellm-export CKPT/base OUT --mtp --mtp-draft-dir
CKPT/draft` (`OUT/llm` is the fixture's `base`, `OUT/mtp_draft` its `draft`). The draft's references are
transformers' own `Gemma4AssistantForCausalLM` over the target's `shared_kv_states`, at Edge-LLM's constant draft
position (`scripts/parity_cases/gemma4_mtp.py::draft_chain`)."""

ROLES = {"base": Role("llm", BASE_BUILDER, "base", "gemma4_mtp", checkpoint="base"),
         "draft": Role("mtp_draft", DRAFT_BUILDER, "draft", "gemma4_mtp", checkpoint="draft")}

CASES = [
    Case("gemma4-mtp", "Gemma 4 MTP pair: a Gemma 4 text target (6 layers of 64, S S F S S F, window 64, layers 4-5 "
         "sharing the KV of 3 and 2, PLE of 8, dual RoPE, softcapping 30, vocab 512) and a two-layer "
         "Gemma4Assistant draft (hidden 32, S F reading target layers 3 and 2, ordered embeddings, 8 centroids top 2).",
         checkpoint, ROLES, export=export, sequences=SEQUENCES, reference=reference, notes=NOTES),
]
