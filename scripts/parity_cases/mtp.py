"""MTP: a Qwen3.5 checkpoint with its native multi-token-prediction head (``mtp.*``), exported with ``--mtp``.

The base is a Qwen3.5 hybrid of three Gated DeltaNet layers and one gated attention layer (heads of 128, the only size
the 0.11 GDN plugin builds); the MTP head one full-attention layer (``pre_fc_norm_embedding`` / ``pre_fc_norm_hidden``,
``fc`` over ``[embedding | base hidden]``, a Qwen3.5 gated attention layer, ``norm``, the base's ``lm_head``). The
exporter builds the draft from the checkpoint's ``mtp.*`` tensors (``model.py::_mtp_key_remap``: ``mtp.`` stripped,
``lm_head`` shared with the base where the checkpoint has no ``mtp.lm_head``); ``mtp_num_hidden_layers`` in the
config marks the checkpoint MTP-capable.

The references (``reference.npz``), all fp32:

* Hugging Face's logits of the base (``Qwen3_5ForCausalLM``, which ignores ``mtp.*``) on each prompt and its greedy
  continuation, every row from the prompt's last token on; the greedy rows keep a top-1/top-2 gap of at least
  ``GAP``;
* the verify chains of the rounds the tests replay ("drafts made elsewhere", from Hugging Face's own tokens): per
  round, the pending token then ``DEPTH`` levels, the true greedy tokens up to the sequence's deviation level, where
  the runner-up (the parent's second-best token) stands instead, then Hugging Face's greedy tokens on that wrong path.
  A hybrid base verifies chains (``mtp_tree_base`` false); the deviation levels (``DEVIATE``) make the accepted
  lengths 4, 3 or fewer, so that a round commits the states of another chain node for each sequence. Hugging Face's
  logits at every node off the true continuation are stored (``path_keys_i``);
* the draft's logits at the rows the tests compare: its committed rows (row p: the embedding of token p + 1 and the
  base's last hidden state at p, at position p, causal) and every chain node (its parent's output hidden state, at
  position committed + depth - 1, seeing the committed rows and its ancestors). Transformers has no MTP class for
  Qwen3.5: :class:`MtpReference` is the head's forward in torch with transformers' Qwen3.5 parts
  (``Qwen3_5RMSNorm``, ``Qwen3_5DecoderLayer`` of a full-attention layer, ``Qwen3_5TextRotaryEmbedding``), written
  from the head's checkpoint layout (vLLM's ``Qwen3NextMultiTokenPredictor``: ``fc(cat(norm(embedding),
  norm(hidden)))``, one decoder layer, ``norm``; the next level's hidden input is the normed output), over
  Hugging Face's base hidden states (``model.model(...).last_hidden_state``, after the final norm, as the base graph
  emits them).
"""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
from make_parity_fixtures import GAP, Case, Role, Sequence, gap, hf_logits, load_hf, save_checkpoint, seeded_model

from parity_cases.hybrid import retuned

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER, VOCAB = 64, 2, 1, 32, 128, 512
LAYER_TYPES = ["linear_attention", "linear_attention", "full_attention", "linear_attention"]
CONTINUATION = 14  # greedy tokens after each prompt: three chain rounds accept up to 4 tokens each
DEPTH, TOP_K = 3, 1  # draft_step, draft_top_k: chains
ROUNDS = 3
VERIFY_SIZE = 1 + DEPTH
# Per sequence, the level of each round's chain where the runner-up stands (None: the whole chain is true).
DEVIATE: tuple[tuple[int | None, ...], ...] = ((None, None, None), (3, 3, 2), (2, 1, None))
BUILDER = {"max_batch_size": 4, "max_input_len": 64, "max_kv_cache_capacity": 256}
BASE_BUILDER = {**BUILDER, "max_verify_tree_size": VERIFY_SIZE}
# The draft's steps take up to VERIFY_SIZE rows a sequence: a catch-up runs over an accepted path of up to DEPTH + 1
# tokens (Edge-LLM's MTPDecoder: acceptDims(batch, draftingStep + 1)), more than a chain's DEPTH proposal nodes.
DRAFT_BUILDER = {**BUILDER, "max_draft_tree_size": VERIFY_SIZE}
SEQUENCES = (Sequence("spec", 7), Sequence("spec", 12), Sequence("spec", 5))


def qwen3_5_config(*, mtp: bool = True) -> Any:
    """The Qwen3.5 base of the speculative cases (``mtp``: with ``mtp_num_hidden_layers`` 1, the key that marks a
    checkpoint MTP-capable)."""
    from transformers import Qwen3_5TextConfig

    return Qwen3_5TextConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=INTER, num_hidden_layers=len(LAYER_TYPES),
        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM, max_position_embeddings=4096,
        layer_types=LAYER_TYPES, linear_num_key_heads=1, linear_num_value_heads=2, linear_key_head_dim=128,
        linear_value_head_dim=128, linear_conv_kernel_dim=4, initializer_range=0.2, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
        architectures=["Qwen3_5ForCausalLM"], **({"mtp_num_hidden_layers": 1} if mtp else {}))


def checkpoint(folder: Path, seed: int) -> None:
    """The base as the hybrid case makes it (seeded, fp16 values, each recurrent layer's own time constants), then
    the MTP head's tensors under the names Qwen3.5 checkpoints give them, seeded, fp16 values: linear weights
    ``0.2 N(0, 1)``, norm weights ``0.3 N(0, 1)`` (Qwen3.5's norms scale by ``1 + weight``)."""
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import Qwen3_5ForCausalLM

    save_checkpoint(retuned(seeded_model(Qwen3_5ForCausalLM, qwen3_5_config(), seed), seed, (0.02, 0.3)), folder)
    g = torch.Generator().manual_seed(seed + 7)

    def w(*shape: int) -> torch.Tensor:
        return (0.2 * torch.randn(*shape, generator=g)).to(torch.float16)

    def norm(n: int = HIDDEN) -> torch.Tensor:
        return (0.3 * torch.randn(n, generator=g)).to(torch.float16)

    layer = "mtp.layers.0."
    head = {
        "mtp.fc.weight": w(HIDDEN, 2 * HIDDEN), "mtp.pre_fc_norm_embedding.weight": norm(),
        "mtp.pre_fc_norm_hidden.weight": norm(), "mtp.norm.weight": norm(),
        layer + "input_layernorm.weight": norm(), layer + "post_attention_layernorm.weight": norm(),
        layer + "self_attn.q_proj.weight": w(2 * HEADS * HEAD_DIM, HIDDEN),
        layer + "self_attn.k_proj.weight": w(KV_HEADS * HEAD_DIM, HIDDEN),
        layer + "self_attn.v_proj.weight": w(KV_HEADS * HEAD_DIM, HIDDEN),
        layer + "self_attn.o_proj.weight": w(HIDDEN, HEADS * HEAD_DIM),
        layer + "self_attn.q_norm.weight": norm(HEAD_DIM), layer + "self_attn.k_norm.weight": norm(HEAD_DIM),
        layer + "mlp.gate_proj.weight": w(INTER, HIDDEN), layer + "mlp.up_proj.weight": w(INTER, HIDDEN),
        layer + "mlp.down_proj.weight": w(HIDDEN, INTER),
    }
    (file,) = folder.glob("*.safetensors")
    tensors = load_file(file)
    tensors.update(head)
    save_file(tensors, file, metadata={"format": "pt"})


def export(ckpt: Path, out: Path) -> None:
    exe = Path(sys.executable).with_name("tensorrt-edgellm-export")
    done = subprocess.run([str(exe), str(ckpt), str(out), "--mtp"], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"tensorrt-edgellm-export failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")


# -- the head's forward --------------------------------------------------------------------------------------------


class MtpReference:
    """The MTP head's forward in fp32 torch (module docstring): rows of (token, hidden input, position) attending to
    the rows a visibility matrix allows; ``hidden input`` is the base's last hidden state for a committed row and
    the parent's output (normed) for a chain node."""

    def __init__(self, folder: Path, model: Any) -> None:
        import torch
        from safetensors.torch import load_file
        from transformers.models.qwen3_5.modeling_qwen3_5 import (
            Qwen3_5DecoderLayer,
            Qwen3_5RMSNorm,
            Qwen3_5TextRotaryEmbedding,
        )

        (file,) = folder.glob("*.safetensors")
        w = {k[len("mtp."):]: v.to(torch.float32) for k, v in load_file(file).items() if k.startswith("mtp.")}
        config = copy.deepcopy(model.config)
        config.layer_types = ["full_attention"]
        config.num_hidden_layers = 1
        config._attn_implementation = "eager"
        eps = config.rms_norm_eps
        self.norms = {}
        for name in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
            n = Qwen3_5RMSNorm(HIDDEN, eps=eps)
            n.weight.data.copy_(w[f"{name}.weight"])
            self.norms[name] = n.eval()
        self.fc = w["fc.weight"]
        self.layer = Qwen3_5DecoderLayer(config, 0).eval()
        self.layer.load_state_dict({k[len("layers.0."):]: v for k, v in w.items() if k.startswith("layers.0.")})
        self.rotary = Qwen3_5TextRotaryEmbedding(config)
        self.embedding = model.model.embed_tokens.weight.detach().to(torch.float32)
        self.lm_head = model.lm_head.weight.detach().to(torch.float32)

    def forward(self, tokens: Any, hidden: Any, positions: Any, visible: Any) -> Any:
        """Output hidden states [N, H] (normed: what the graph emits and feeds back) of N rows: ``tokens`` [N],
        ``hidden`` [N, H], ``positions`` [N], ``visible`` [N, N] bool (row i attends to row j)."""
        import torch

        x = torch.cat([self.norms["pre_fc_norm_embedding"](self.embedding[tokens]),
                       self.norms["pre_fc_norm_hidden"](hidden)], dim=-1) @ self.fc.T
        mask = torch.zeros(visible.shape, dtype=torch.float32).masked_fill(~visible, float("-inf"))[None, None]
        pos = positions[None]
        out = self.layer(x[None], position_embeddings=self.rotary(x[None], pos), attention_mask=mask,
                         position_ids=pos)
        return self.norms["norm"](out[0])

    def logits(self, out: Any) -> Any:
        import torch

        return torch.log_softmax(out @ self.lm_head.T, dim=-1)


def _features(model: Any, tokens: np.ndarray) -> Any:
    """The base's ``hidden_states`` of every position: Hugging Face's last hidden state (after the final norm)."""
    import torch

    with torch.no_grad():
        return model.model(torch.tensor(tokens, dtype=torch.long)[None]).last_hidden_state[0]


# -- the chains ----------------------------------------------------------------------------------------------------


def _top2(row: np.ndarray) -> tuple[int, int]:
    order = np.argsort(-row, kind="stable")
    return int(order[0]), int(order[1])


def _chain(model: Any, tokens: np.ndarray, logits: np.ndarray, c: int, deviate: int | None) -> list[int]:
    """A round's chain after ``c`` committed tokens: the pending token, then the true tokens up to level
    ``deviate``, the runner-up there, then Hugging Face's greedy tokens on that path."""
    chain = [int(tokens[c])]
    for level in range(1, DEPTH + 1):
        if deviate is None or level < deviate:
            chain.append(int(tokens[c + level]))
        elif level == deviate:
            chain.append(_top2(logits[c + level - 1])[1])
        else:
            chain.append(int(hf_logits(model, np.concatenate([tokens[:c], chain]))[-1].argmax()))
    return chain


def _draw(model: Any, length: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A prompt of ``length`` tokens and its ``CONTINUATION`` greedy tokens, every greedy row's gap >= GAP:
    (tokens, HF logits of every position)."""
    for _ in range(4000):
        tokens = rng.integers(1, VOCAB, length)
        ok = True
        for _ in range(CONTINUATION):
            row = hf_logits(model, tokens)[-1]
            if gap(row) < GAP:
                ok = False
                break
            tokens = np.append(tokens, int(row.argmax()))
        if ok:
            return tokens.astype(np.int32), hf_logits(model, tokens[:-1])
    raise RuntimeError(f"no prompt of {length} tokens with {CONTINUATION} greedy gaps >= {GAP} in 4000 draws")


def _pad(key: list[int], width: int) -> list[int]:
    return key + [-1] * (width - len(key))


def reference(case: Case, ckpt: Path, out: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    import torch

    del out
    model = load_hf(ckpt)
    head = MtpReference(ckpt, model)
    arrays: dict[str, np.ndarray] = {}
    sequences = []
    width = 1 + DEPTH + 1  # C, then a path of at most DEPTH + 1 tokens
    for i, seq in enumerate(case.sequences):
        tokens, logits = _draw(model, seq.length, np.random.default_rng(case.seed * 1000 + i))
        n, length = len(tokens), seq.length
        rows = np.arange(length - 1, n - 1, dtype=np.int32)
        arrays[f"tokens_{i}"], arrays[f"positions_{i}"] = tokens, rows
        arrays[f"logits_{i}"] = logits[rows].astype(np.float32)
        with torch.no_grad():  # the draft's committed rows: row p holds token p + 1 over the base's state at p
            feats = _features(model, tokens[:-1])
            t = torch.tensor(tokens[1:], dtype=torch.long)
            pos = torch.arange(n - 1)
            causal = torch.ones(n - 1, n - 1, dtype=torch.bool).tril()
            committed = head.forward(t, feats, pos, causal)
            arrays[f"draft_logits_{i}"] = head.logits(committed)[rows].numpy().astype(np.float32)
        c = length
        keys, key_logits, dkeys, dkey_logits, chains, commits = [], [], [], [], [], []
        for r in range(ROUNDS):
            deviate = DEVIATE[i][r]
            chain = _chain(model, tokens, logits, c, deviate)
            chains.append(chain)
            commits.append(c)
            for node in range(1, len(chain) + 1):  # verify nodes off the true continuation
                path = chain[:node]
                if path != [int(x) for x in tokens[c:c + node]]:
                    keys.append(_pad([c, *path], width))
                    key_logits.append(hf_logits(model, np.concatenate([tokens[:c], path]))[-1])
            with torch.no_grad():  # the draft's chain: node j (level j) at position c + j - 1 over its parent's output
                outs = [committed[c - 1]]  # the hidden inputs: the root's output, then each node's
                for m in range(1, DEPTH + 1):
                    vis = torch.zeros(c + m, c + m, dtype=torch.bool)
                    vis[:c, :c] = causal[:c, :c]
                    vis[c:, :c] = True
                    vis[c:, c:] = torch.ones(m, m, dtype=torch.bool).tril()
                    res = head.forward(torch.cat([t[:c], torch.tensor(chain[1:m + 1], dtype=torch.long)]),
                                       torch.cat([feats[:c], torch.stack(outs)]),
                                       torch.cat([pos[:c], c + torch.arange(m)]), vis)[c:]
                    outs.append(res[m - 1])
                    dkeys.append(_pad([c, *chain[1:m + 1]], width))
                    dkey_logits.append(head.logits(res[m - 1]).numpy())
            c += (DEPTH + 1) if deviate is None else deviate
        arrays[f"path_keys_{i}"] = np.array(keys, np.int32).reshape(-1, width)
        arrays[f"path_logits_{i}"] = np.array(key_logits, np.float32).reshape(-1, VOCAB)
        arrays[f"draft_path_keys_{i}"] = np.array(dkeys, np.int32).reshape(-1, width)
        arrays[f"draft_path_logits_{i}"] = np.array(dkey_logits, np.float32).reshape(-1, VOCAB)
        arrays[f"tree_tokens_{i}"] = np.array(chains, np.int32)
        arrays[f"tree_parents_{i}"] = np.tile(np.arange(-1, DEPTH, dtype=np.int32), (ROUNDS, 1))
        arrays[f"tree_commits_{i}"] = np.array(commits, np.int32)
        greedy = logits[length - 1:n - 1]
        sequences.append({"purpose": seq.purpose, "prompt_length": length, "marks": [],
                          "smallest_greedy_gap": round(min(gap(r) for r in greedy), 4)})
    meta = {"sequences": sequences, "continuation": CONTINUATION,
            "spec": {"draft_top_k": TOP_K, "draft_step": DEPTH, "verify_size": VERIFY_SIZE, "rounds": ROUNDS}}
    return arrays, meta


NOTES = """Exported by one run of the real exporter: `tensorrt-edgellm-export CKPT OUT --mtp` (`OUT/llm` is the
fixture's `base`, `OUT/mtp_draft` its `draft`). The checkpoint is a `Qwen3_5ForCausalLM` save with the MTP head's
`mtp.*` tensors added (Hugging Face's class ignores them) and `mtp_num_hidden_layers: 1` in its config. Transformers
has no Qwen3.5 MTP class: the draft's references come from `scripts/parity_cases/mtp.py::MtpReference` (the head's
forward in torch with transformers' Qwen3.5 parts, over Hugging Face's base hidden states)."""

CASES = [
    Case("qwen3_5-mtp", "MTP pair on a Qwen3.5 hybrid base: 3 Gated DeltaNet layers (heads of 128) and 1 gated "
         "attention layer, hidden 64, vocab 512, and its one-layer MTP head (exported with --mtp); verify chains "
         "of 4.",
         checkpoint, {"base": Role("llm", BASE_BUILDER, "base", "mtp"),
                      "draft": Role("mtp_draft", DRAFT_BUILDER, "draft", "mtp")},
         export=export, sequences=SEQUENCES, reference=reference, notes=NOTES),
]
