"""DFlash: a base exported with ``--dflash-base`` and a DFlash (version 1) block draft checkpoint exported with
``--dflash-draft --dflash-draft-dir``: ``qwen3-dflash`` on a dense Qwen3 base, ``qwen3_5-dflash`` on the MTP case's
Qwen3.5 hybrid base (three Gated DeltaNet layers and a gated attention layer; Edge-LLM 0.11 exports every DFlash base
as a DDTree base, ``model.py``: ``dflash_base`` sets ``dflash_tree_base``, so its recurrent plugins carry
``use_ddtree``).

The draft checkpoint is laid out as z-lab's Qwen3 DFlash drafts ship (``architectures: ["DFlashDraftModel"]``, a
Qwen3-architecture config with ``block_size`` and ``dflash_config {target_layer_ids, block_size, mask_token_id}``;
tensors ``fc`` over the target layers' hidden states side by side, ``hidden_norm``, one Qwen3 decoder layer
``layers.0.*``, ``norm``; no ``lm_head`` and no ``embed_tokens``: the exporter takes the base's ``lm_head`` and the
runtime the base's embedding, the mask token's row included).

The references (``reference.npz``), all fp32:

* Hugging Face's logits of the base (``Qwen3ForCausalLM`` / ``Qwen3_5ForCausalLM``) on each prompt and its greedy
  continuation, as the other spec cases store them (gap >= ``GAP``);
* the verify chains of the rounds the tests replay: per round the pending token and ``BLOCK - 1`` tokens, the true
  greedy ones up to the sequence's deviation level (``DEVIATE``), the runner-up there, then Hugging Face's greedy
  tokens on that path; Hugging Face's logits at every node off the true continuation (``path_keys_i``);
* the draft's logits of every block row, for every committed length ``c`` from the prompt's on (the block the draft
  runs once ``c`` tokens are committed: the pending token ``tokens[c]`` and ``BLOCK - 1`` mask tokens at positions
  ``c .. c + BLOCK - 1``, each row seeing the whole block and the ``c`` committed positions, whose keys and values the
  draft takes from the base's hidden states of its ``target_layer_ids`` at those positions): ``draft_blocks_i``
  ``[c - prompt length, BLOCK, V]``. Transformers has no DFlash class: :class:`DFlashReference` is the draft's
  forward in torch with transformers' Qwen3 parts (``Qwen3RMSNorm``, ``Qwen3MLP``, ``Qwen3RotaryEmbedding``), written
  from z-lab's ``DFlashDraftModel`` (context keys and values ``k_proj`` / ``v_proj`` of ``hidden_norm(fc(target))``,
  the block's own of ``input_layernorm(block)``, ``k_norm`` on both, one non-causal attention over context and
  block), over Hugging Face's base hidden states (``hidden_states[l + 1]``: the output of decoder layer ``l``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from make_parity_fixtures import Case, Role, Sequence, draw, gap, hf_logits, load_hf, save_checkpoint, seeded_model

from parity_cases.hybrid import retuned
from parity_cases.mtp import qwen3_5_config

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER, VOCAB, LAYERS = 64, 4, 2, 16, 128, 512, 6
BLOCK, MASK = 4, 511
CONTINUATION = 14
DEPTH = BLOCK - 1  # the guesses a block verifies after its root
ROUNDS = 3
DEVIATE: tuple[tuple[int | None, ...], ...] = ((None, None, None), (3, 3, 2), (2, 1, None))
BUILDER = {"max_batch_size": 4, "max_input_len": 64, "max_kv_cache_capacity": 256}
BASE_BUILDER = {**BUILDER, "max_verify_tree_size": BLOCK}
DRAFT_BUILDER = {**BUILDER, "max_draft_tree_size": BLOCK}
SEQUENCES = (Sequence("spec", 7), Sequence("spec", 12), Sequence("spec", 5))


def _base(folder: Path, seed: int) -> None:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=INTER, num_hidden_layers=LAYERS,
                         num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM,
                         max_position_embeddings=512, rope_theta=10000.0, initializer_range=0.2,
                         tie_word_embeddings=False)
    save_checkpoint(seeded_model(Qwen3ForCausalLM, config, seed), folder)


def _draft(folder: Path, seed: int, targets: list[int], **block: Any) -> None:
    """The draft checkpoint (module docstring), seeded, float16 values: linear weights ``0.2 N(0, 1)``, norm
    weights ``1 + 0.3 N(0, 1)``; ``block``: more keys of its ``dflash_config`` (a JetSpec draft's ``causal_head``)."""
    import torch
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(seed + 1)

    def w(*shape: int) -> torch.Tensor:
        return (0.2 * torch.randn(*shape, generator=g)).to(torch.float16)

    def norm(n: int = HIDDEN) -> torch.Tensor:
        return (1.0 + 0.3 * torch.randn(n, generator=g)).to(torch.float16)

    layer = "layers.0."
    tensors = {
        "fc.weight": w(HIDDEN, len(targets) * HIDDEN), "hidden_norm.weight": norm(), "norm.weight": norm(),
        layer + "input_layernorm.weight": norm(), layer + "post_attention_layernorm.weight": norm(),
        layer + "self_attn.q_proj.weight": w(HEADS * HEAD_DIM, HIDDEN),
        layer + "self_attn.k_proj.weight": w(KV_HEADS * HEAD_DIM, HIDDEN),
        layer + "self_attn.v_proj.weight": w(KV_HEADS * HEAD_DIM, HIDDEN),
        layer + "self_attn.o_proj.weight": w(HIDDEN, HEADS * HEAD_DIM),
        layer + "self_attn.q_norm.weight": norm(HEAD_DIM), layer + "self_attn.k_norm.weight": norm(HEAD_DIM),
        layer + "mlp.gate_proj.weight": w(INTER, HIDDEN), layer + "mlp.up_proj.weight": w(INTER, HIDDEN),
        layer + "mlp.down_proj.weight": w(HIDDEN, INTER),
    }
    folder.mkdir(parents=True)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    config = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": HIDDEN,
              "intermediate_size": INTER, "num_hidden_layers": 1, "num_attention_heads": HEADS,
              "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM, "vocab_size": VOCAB, "rms_norm_eps": 1e-6,
              "rope_theta": 10000.0, "max_position_embeddings": 512, "hidden_act": "silu", "attention_bias": False,
              "tie_word_embeddings": False, "torch_dtype": "float16", "block_size": BLOCK,
              "dflash_config": {"target_layer_ids": targets, "block_size": BLOCK, "mask_token_id": MASK, **block}}
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (folder / "chat_template.jinja").write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")


def _hybrid_base(folder: Path, seed: int) -> None:
    """The MTP case's Qwen3.5 base (three Gated DeltaNet layers, one gated attention layer), without its MTP head."""
    from transformers import Qwen3_5ForCausalLM

    save_checkpoint(retuned(seeded_model(Qwen3_5ForCausalLM, qwen3_5_config(mtp=False), seed), seed, (0.02, 0.3)),
                    folder)


def _checkpoint(base: Callable[[Path, int], None], targets: list[int]) -> Callable[[Path, int], None]:
    def make(folder: Path, seed: int) -> None:
        base(folder / "base", seed)
        _draft(folder / "draft", seed, targets)
    return make


def export(ckpt: Path, out: Path) -> None:
    exe = Path(sys.executable).with_name("tensorrt-edgellm-export")
    args = [ckpt / "base", out, "--dflash-base", "--dflash-draft", "--dflash-draft-dir", ckpt / "draft"]
    done = subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"tensorrt-edgellm-export failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")


# -- the draft's forward -------------------------------------------------------------------------------------------


class DFlashReference:
    """The DFlash draft's forward in fp32 torch (module docstring): a block of rows attending to every committed
    position (keys and values from the target features) and to each other."""

    def __init__(self, folder: Path, model: Any) -> None:
        import torch
        from safetensors.torch import load_file
        from transformers import Qwen3Config
        from transformers.models.qwen3.modeling_qwen3 import Qwen3MLP, Qwen3RMSNorm, Qwen3RotaryEmbedding

        raw = json.loads((folder / "config.json").read_text())
        config = Qwen3Config(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=INTER, num_hidden_layers=1,
                             num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM,
                             rms_norm_eps=raw["rms_norm_eps"], max_position_embeddings=raw["max_position_embeddings"],
                             rope_parameters={"rope_type": "default", "rope_theta": raw["rope_theta"]})
        w = {k: v.to(torch.float32) for k, v in load_file(str(folder / "model.safetensors")).items()}
        self.w = w
        eps = raw["rms_norm_eps"]

        def rms(name: str, n: int) -> Any:
            layer = Qwen3RMSNorm(n, eps=eps)
            layer.weight.data.copy_(w[f"{name}.weight"])
            return layer

        self.hidden_norm, self.norm = rms("hidden_norm", HIDDEN), rms("norm", HIDDEN)
        self.input_norm = rms("layers.0.input_layernorm", HIDDEN)
        self.post_norm = rms("layers.0.post_attention_layernorm", HIDDEN)
        self.q_norm, self.k_norm = rms("layers.0.self_attn.q_norm", HEAD_DIM), rms("layers.0.self_attn.k_norm",
                                                                                    HEAD_DIM)
        self.mlp = Qwen3MLP(config)
        for proj in ("gate_proj", "up_proj", "down_proj"):
            getattr(self.mlp, proj).weight.data.copy_(w[f"layers.0.mlp.{proj}.weight"])
        self.rotary = Qwen3RotaryEmbedding(config)
        self.embedding = model.model.embed_tokens.weight.detach().to(torch.float32)
        self.lm_head = model.lm_head.weight.detach().to(torch.float32)

    def _proj(self, name: str, x: Any, heads: int) -> Any:
        return (x @ self.w[f"layers.0.self_attn.{name}.weight"].T).view(x.shape[0], heads, HEAD_DIM)

    def block(self, target: Any, block_tokens: Any, c: int, causal: bool = False) -> Any:
        """Logits [B, V] of a block after ``c`` committed positions: ``target`` [c, 3H] the target features of
        positions 0 .. c - 1, ``block_tokens`` [B] at positions c .. c + B - 1; ``causal``: block row ``i`` sees
        block rows ``0 .. i`` only (a JetSpec draft, trained with ``causal_head``), not the whole block."""
        import torch
        from transformers.models.qwen3.modeling_qwen3 import apply_rotary_pos_emb, repeat_kv

        ctx = self.hidden_norm(target @ self.w["fc.weight"].T)
        x = self.embedding[block_tokens]
        normed = self.input_norm(x)
        b = x.shape[0]
        q = self.q_norm(self._proj("q_proj", normed, HEADS))
        k = self.k_norm(torch.cat([self._proj("k_proj", ctx, KV_HEADS), self._proj("k_proj", normed, KV_HEADS)]))
        v = torch.cat([self._proj("v_proj", ctx, KV_HEADS), self._proj("v_proj", normed, KV_HEADS)])
        positions = torch.arange(c + b)[None]
        cos, sin = self.rotary(v[None], positions)
        q, _ = apply_rotary_pos_emb(q.transpose(0, 1)[None], q.transpose(0, 1)[None], cos[:, c:], sin[:, c:])
        k, _ = apply_rotary_pos_emb(k.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin)
        k, v = repeat_kv(k, HEADS // KV_HEADS), repeat_kv(v.transpose(0, 1)[None], HEADS // KV_HEADS)
        scores = (q @ k.transpose(-1, -2)) * HEAD_DIM ** -0.5  # every row sees every key (DFlash)
        if causal:  # but the block rows after its own (JetSpec)
            later = torch.arange(c + b)[None, :] > (c + torch.arange(b))[:, None]
            scores = scores.masked_fill(later, float("-inf"))
        attn = torch.softmax(scores, dim=-1) @ v
        h = x + attn[0].transpose(0, 1).reshape(b, HEADS * HEAD_DIM) @ self.w["layers.0.self_attn.o_proj.weight"].T
        h = h + self.mlp(self.post_norm(h))
        return self.norm(h) @ self.lm_head.T


def _features(model: Any, tokens: np.ndarray, targets: list[int]) -> Any:
    """The base's DFlash features of every position: Hugging Face's outputs of the target layers, side by side."""
    import torch

    with torch.no_grad():
        hs = model(torch.tensor(tokens, dtype=torch.long)[None], output_hidden_states=True).hidden_states
    return torch.cat([hs[layer + 1][0] for layer in targets], dim=-1)


# -- the chains ----------------------------------------------------------------------------------------------------


def _top2(row: np.ndarray) -> tuple[int, int]:
    order = np.argsort(-row, kind="stable")
    return int(order[0]), int(order[1])


def _chain(model: Any, tokens: np.ndarray, logits: np.ndarray, c: int, deviate: int | None) -> list[int]:
    chain = [int(tokens[c])]
    for level in range(1, DEPTH + 1):
        if deviate is None or level < deviate:
            chain.append(int(tokens[c + level]))
        elif level == deviate:
            chain.append(_top2(logits[c + level - 1])[1])
        else:
            chain.append(int(hf_logits(model, np.concatenate([tokens[:c], chain]))[-1].argmax()))
    return chain


def reference(case: Case, ckpt: Path, out: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    import torch

    del out
    targets = case.extra["target_layer_ids"]
    model = load_hf(ckpt / "base")
    draft = DFlashReference(ckpt / "draft", model)
    arrays: dict[str, np.ndarray] = {}
    sequences = []
    width = 1 + DEPTH + 1
    for i, seq in enumerate(case.sequences):
        tokens, logits = draw(model, VOCAB, seq.length, np.random.default_rng(case.seed * 1000 + i),
                              tries=4000, continuation=CONTINUATION)
        n, length = len(tokens), seq.length
        rows = np.arange(length - 1, n - 1, dtype=np.int32)
        arrays[f"tokens_{i}"], arrays[f"positions_{i}"] = tokens, rows
        arrays[f"logits_{i}"] = logits[rows].astype(np.float32)
        with torch.no_grad():
            feats = _features(model, tokens, targets)
            blocks = [draft.block(feats[:c], torch.tensor([int(tokens[c])] + [MASK] * DEPTH), c,
                                  causal=case.extra.get("causal", False)).numpy() for c in range(length, n)]
        arrays[f"draft_blocks_{i}"] = np.array(blocks, np.float32)
        c = length
        keys, key_logits, chains, commits = [], [], [], []
        for r in range(ROUNDS):
            chain = _chain(model, tokens, logits, c, DEVIATE[i][r])
            chains.append(chain)
            commits.append(c)
            for node in range(1, len(chain) + 1):
                path = chain[:node]
                if path != [int(x) for x in tokens[c:c + node]]:
                    keys.append([c, *path, *[-1] * (width - 1 - len(path))])
                    key_logits.append(hf_logits(model, np.concatenate([tokens[:c], path]))[-1])
            c += (DEPTH + 1) if DEVIATE[i][r] is None else DEVIATE[i][r]
        arrays[f"path_keys_{i}"] = np.array(keys, np.int32).reshape(-1, width)
        arrays[f"path_logits_{i}"] = np.array(key_logits, np.float32).reshape(-1, VOCAB)
        arrays[f"tree_tokens_{i}"] = np.array(chains, np.int32)
        arrays[f"tree_parents_{i}"] = np.tile(np.arange(-1, DEPTH, dtype=np.int32), (ROUNDS, 1))
        arrays[f"tree_commits_{i}"] = np.array(commits, np.int32)
        greedy = logits[length - 1:n - 1]
        sequences.append({"purpose": seq.purpose, "prompt_length": length, "marks": [],
                          "smallest_greedy_gap": round(min(gap(r) for r in greedy), 4)})
    meta = {"sequences": sequences, "continuation": CONTINUATION,
            "spec": {"draft_top_k": 1, "draft_step": DEPTH, "verify_size": BLOCK, "rounds": ROUNDS,
                     "block_size": BLOCK, "mask_token_id": MASK, "target_layer_ids": targets}}
    return arrays, meta


NOTES = """Exported by one run of the real exporter: `tensorrt-edgellm-export CKPT/base OUT --dflash-base --dflash-draft
--dflash-draft-dir CKPT/draft` (`OUT/llm` is the fixture's `base`, `OUT/dflash_draft` its `draft`). Transformers has
no DFlash class: the draft's references come from `scripts/parity_cases/dflash.py::DFlashReference` (the draft's
forward in torch with transformers' Qwen3 parts, over Hugging Face's base hidden states)."""

ROLES = {"base": Role("llm", BASE_BUILDER, "base", "dflash", checkpoint="base"),
         "draft": Role("dflash_draft", DRAFT_BUILDER, "draft", "dflash", checkpoint="draft")}

CASES = [
    Case("qwen3-dflash", "DFlash pair: a Qwen3 base (6 layers of 64, QK norm, vocab 512; target layers 1, 3, 4) and a "
         "one-layer DFlash (version 1) block draft of 4 rows, mask token 511.",
         _checkpoint(_base, [1, 3, 4]), ROLES, export=export, sequences=SEQUENCES, reference=reference, notes=NOTES,
         extra={"target_layer_ids": [1, 3, 4]}),
    Case("qwen3_5-dflash", "DFlash pair on a Qwen3.5 hybrid base (the MTP case's: 3 Gated DeltaNet layers, 1 gated "
         "attention layer, hidden 64, vocab 512; target layers 0, 1, 2) and a one-layer DFlash (version 1) block draft "
         "of 4 rows, mask token 511.",
         _checkpoint(_hybrid_base, [0, 1, 2]), ROLES, export=export, sequences=SEQUENCES, reference=reference,
         notes=NOTES, extra={"target_layer_ids": [0, 1, 2]}),
]
