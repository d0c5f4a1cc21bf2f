"""EAGLE3: a Qwen3 base exported with ``--eagle-base`` and a ``LlamaForCausalLMEagle3`` draft checkpoint.

The references (``reference.npz``), all fp32:

* Hugging Face's logits of the base on each prompt and its greedy continuation (every row from the prompt's last
  token on), as the dense cases store them; the greedy rows keep a top-1/top-2 gap of at least ``GAP``, so an
  accept decision (a node's token against its parent's greedy token) cannot flip under fp16 rounding;
* the verify trees of the rounds the tests replay ("drafts made elsewhere", from Hugging Face's own tokens): per
  round, the pending token, then ``DEPTH`` levels of ``TOP_K`` nodes, the true greedy token and the runner-up (the
  second-best token) under one node of the level before. Sequence 1 puts the runner-up first; sequence 2's last
  level hangs under a wrong node, so its accepted path is a node shorter. Hugging Face's logits at every node (the
  prompt, the accepted tokens and the node's path) are stored;
* the draft's logits at the rows the tests compare: its prefill/catch-up rows (the prompt and the accepted tokens,
  shifted by one, over the base's hidden states) and the nodes of the replayed draft trees (each node's draft
  hidden state its parent's output, at position committed length + depth, seeing the committed rows and its
  ancestors). Transformers has no EAGLE3 draft class: :class:`DraftReference` is the draft's forward in torch with
  transformers' Llama parts (RMSNorm, rotary embedding, MLP), written from the EAGLE3 architecture the checkpoint
  layout names (``fc`` over three base layers, one ``midlayer`` over ``[input_layernorm(embedding) |
  hidden_norm(hidden)]``, ``norm``, ``lm_head`` over the draft vocabulary, log-softmax), reading the base's hidden
  states of the layers the exported base graph emits (``eagle_hidden_state_layers`` of its ``config.json``) from
  Hugging Face's forward.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
from make_parity_fixtures import Case, Role, Sequence, draw, gap, hf_logits, load_hf, save_checkpoint, seeded_model

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER = 64, 4, 2, 16, 128
VOCAB, DRAFT_VOCAB = 512, 256
LAYERS = 7  # the builder's default EAGLE3 target layers [2, n // 2, n - 3] must be distinct: n >= 7
CONTINUATION = 14  # greedy tokens after each prompt: three tree rounds accept up to 4 tokens each
DEPTH, TOP_K = 3, 2  # draft_step, draft_top_k
ROUNDS = 3  # replayed tree rounds
VERIFY_SIZE = 1 + DEPTH * TOP_K
BUILDER = {"max_batch_size": 4, "max_input_len": 64, "max_kv_cache_capacity": 256}
BASE_BUILDER = {**BUILDER, "max_verify_tree_size": 8}
DRAFT_BUILDER = {**BUILDER, "max_draft_tree_size": DEPTH * TOP_K}
SEQUENCES = (Sequence("spec", 7), Sequence("spec", 12), Sequence("spec", 5))


def _base(folder: Path, seed: int) -> None:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=INTER, num_hidden_layers=LAYERS,
                         num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM,
                         max_position_embeddings=512, rope_theta=10000.0, initializer_range=0.2,
                         tie_word_embeddings=False)
    save_checkpoint(seeded_model(Qwen3ForCausalLM, config, seed), folder)


def _draft(folder: Path, seed: int) -> None:
    """An EAGLE3 draft checkpoint as the hub's EAGLE3 repositories lay it out (``midlayer.*``, ``fc``, ``d2t``
    offsets), seeded, float16 values, norms ``1 + 0.3 N(0, 1)``; ``draft_vocab_size`` half the base's, its
    columns a seeded sorted subset of the base vocabulary."""
    import torch
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(seed + 1)

    def w(*shape: int) -> torch.Tensor:
        return (0.2 * torch.randn(*shape, generator=g)).to(torch.float16)

    def norm() -> torch.Tensor:
        return (1.0 + 0.3 * torch.randn(HIDDEN, generator=g)).to(torch.float16)

    targets = np.sort(np.random.default_rng(seed + 2).choice(VOCAB, DRAFT_VOCAB, replace=False))
    tensors = {
        "d2t": torch.tensor(targets - np.arange(DRAFT_VOCAB), dtype=torch.int64),
        "fc.weight": w(HIDDEN, 3 * HIDDEN), "norm.weight": norm(), "lm_head.weight": w(DRAFT_VOCAB, HIDDEN),
        "midlayer.hidden_norm.weight": norm(), "midlayer.input_layernorm.weight": norm(),
        "midlayer.post_attention_layernorm.weight": norm(),
        "midlayer.self_attn.q_proj.weight": w(HEADS * HEAD_DIM, 2 * HIDDEN),
        "midlayer.self_attn.k_proj.weight": w(KV_HEADS * HEAD_DIM, 2 * HIDDEN),
        "midlayer.self_attn.v_proj.weight": w(KV_HEADS * HEAD_DIM, 2 * HIDDEN),
        "midlayer.self_attn.o_proj.weight": w(HIDDEN, HEADS * HEAD_DIM),
        "midlayer.mlp.gate_proj.weight": w(INTER, HIDDEN), "midlayer.mlp.up_proj.weight": w(INTER, HIDDEN),
        "midlayer.mlp.down_proj.weight": w(HIDDEN, INTER),
    }
    folder.mkdir(parents=True)
    save_file(tensors, str(folder / "model.safetensors"))
    config = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": HIDDEN,
              "intermediate_size": INTER, "num_hidden_layers": 1, "num_attention_heads": HEADS,
              "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM, "vocab_size": VOCAB,
              "draft_vocab_size": DRAFT_VOCAB, "target_hidden_size": HIDDEN, "rms_norm_eps": 1e-6,
              "rope_theta": 10000.0, "max_position_embeddings": 512, "hidden_act": "silu",
              "tie_word_embeddings": False, "torch_dtype": "float16"}
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (folder / "chat_template.jinja").write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")


def checkpoint(folder: Path, seed: int) -> None:
    _base(folder / "base", seed)
    _draft(folder / "draft", seed)


def export(ckpt: Path, out: Path) -> None:
    exe = Path(sys.executable).with_name("tensorrt-edgellm-export")
    for args in ([ckpt / "draft", out / "draft"],
                 [ckpt / "base", out / "base", "--eagle-base", "--eagle-draft-dir", ckpt / "draft"]):
        done = subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"tensorrt-edgellm-export failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")


# -- the draft's forward -------------------------------------------------------------------------------------------


class DraftReference:
    """The EAGLE3 draft's forward in fp32 torch (module docstring): rows of (token embedding, hidden input,
    position) attending to the rows a visibility matrix allows; ``hidden input`` is ``fc(base features)`` for a
    committed row and the parent's output hidden state for a tree node."""

    def __init__(self, folder: Path, embedding: Any) -> None:
        import torch
        from safetensors.torch import load_file
        from transformers import LlamaConfig
        from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm, LlamaRotaryEmbedding

        raw = json.loads((folder / "config.json").read_text())
        self.config = LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=INTER,
                                  num_hidden_layers=1, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                                  head_dim=HEAD_DIM, rms_norm_eps=raw["rms_norm_eps"],
                                  max_position_embeddings=raw["max_position_embeddings"],
                                  rope_parameters={"rope_type": "default", "rope_theta": raw["rope_theta"]})
        w = {k: v.to(torch.float32) for k, v in load_file(str(folder / "model.safetensors")).items()}
        self.w = w
        self.embedding = embedding
        eps = raw["rms_norm_eps"]
        self.norms = {}
        for name in ("midlayer.hidden_norm", "midlayer.input_layernorm", "midlayer.post_attention_layernorm",
                     "norm"):
            n = LlamaRMSNorm(HIDDEN, eps=eps)
            n.weight.data.copy_(w[f"{name}.weight"])
            self.norms[name] = n
        self.mlp = LlamaMLP(self.config)
        for proj in ("gate_proj", "up_proj", "down_proj"):
            getattr(self.mlp, proj).weight.data.copy_(w[f"midlayer.mlp.{proj}.weight"])
        self.rotary = LlamaRotaryEmbedding(self.config)

    def fc(self, features: Any) -> Any:
        return features @ self.w["fc.weight"].T

    def layer(self, tokens: Any, hidden: Any, positions: Any, visible: Any) -> Any:
        """Output hidden states [N, H] of N rows: ``tokens`` [N], ``hidden`` [N, H] (after fc / the parent's),
        ``positions`` [N], ``visible`` [N, N] bool (row i attends to row j)."""
        import torch
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb, repeat_kv

        n = tokens.shape[0]
        x = torch.cat([self.norms["midlayer.input_layernorm"](self.embedding[tokens]),
                       self.norms["midlayer.hidden_norm"](hidden)], dim=-1)
        q = (x @ self.w["midlayer.self_attn.q_proj.weight"].T).view(1, n, HEADS, HEAD_DIM).transpose(1, 2)
        k = (x @ self.w["midlayer.self_attn.k_proj.weight"].T).view(1, n, KV_HEADS, HEAD_DIM).transpose(1, 2)
        v = (x @ self.w["midlayer.self_attn.v_proj.weight"].T).view(1, n, KV_HEADS, HEAD_DIM).transpose(1, 2)
        cos, sin = self.rotary(v, positions[None])
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        k, v = repeat_kv(k, HEADS // KV_HEADS), repeat_kv(v, HEADS // KV_HEADS)
        scores = (q @ k.transpose(-1, -2)) * HEAD_DIM ** -0.5
        scores = scores.masked_fill(~visible[None, None], float("-inf"))
        attn = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(n, HEADS * HEAD_DIM)
        h = hidden + attn @ self.w["midlayer.self_attn.o_proj.weight"].T
        return h + self.mlp(self.norms["midlayer.post_attention_layernorm"](h))

    def logits(self, out: Any) -> Any:
        import torch

        return torch.log_softmax(self.norms["norm"](out) @ self.w["lm_head.weight"].T, dim=-1)


def _features(model: Any, tokens: np.ndarray, layers: list[int]) -> Any:
    """The base's EAGLE3 features of every position: Hugging Face's hidden states of ``layers`` (indices into its
    ``hidden_states`` tuple, the exported graph's ``eagle_hidden_state_layers``), concatenated."""
    import torch

    with torch.no_grad():
        hs = model(torch.tensor(tokens, dtype=torch.long)[None], output_hidden_states=True).hidden_states
    return torch.cat([hs[i][0] for i in layers], dim=-1)


# -- the trees ---------------------------------------------------------------------------------------------------------


def _top2(row: np.ndarray) -> tuple[int, int]:
    order = np.argsort(-row, kind="stable")
    return int(order[0]), int(order[1])


def _round_tree(model: Any, tokens: np.ndarray, logits: np.ndarray, c: int, index: int
                ) -> tuple[list[int], list[int], int]:
    """Round tree of sequence ``index`` after ``c`` committed tokens: (verify tokens, verify parents, accepted
    path length). Node 0 is the pending token ``tokens[c]``; level j holds the true token and the runner-up under
    the level's spine node (sequence 2's last level under the runner-up of the level before)."""
    toks, parents = [int(tokens[c])], [-1]
    spine, spine_path, true_spine = 0, [int(tokens[c])], True
    accepted = 1
    for level in range(1, DEPTH + 1):
        if true_spine:
            true_tok, runner = int(tokens[c + level]), _top2(logits[c + level - 1])[1]
            pair = [runner, true_tok] if index == 1 else [true_tok, runner]
        else:
            pair = list(_top2(hf_logits(model, np.concatenate([tokens[:c], spine_path]))[-1]))
        first = len(toks)
        toks += pair
        parents += [spine, spine]
        if true_spine:
            accepted += 1
            true_at = first + pair.index(int(tokens[c + level]))
            wrong_at = first + 1 - pair.index(int(tokens[c + level]))
            deviate = index == 2 and level == DEPTH - 1
            spine = wrong_at if deviate else true_at
            spine_path = spine_path + [toks[spine]]
            true_spine = not deviate
        else:
            spine = first
            spine_path = spine_path + [toks[spine]]
    return toks, parents, accepted


def _path(toks: list[int], parents: list[int], node: int) -> list[int]:
    out = []
    while node >= 0:
        out.append(toks[node])
        node = parents[node]
    return out[::-1]


def reference(case: Case, ckpt: Path, out: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    import torch

    model = load_hf(ckpt / "base")
    layers = [int(i) for i in json.loads((out / "base" / "config.json").read_text())["eagle_hidden_state_layers"]]
    embedding = model.model.embed_tokens.weight.detach().to(torch.float32)
    draft = DraftReference(ckpt / "draft", embedding)
    arrays: dict[str, np.ndarray] = {}
    sequences = []
    width = 1 + DEPTH + 1  # C, then a path of at most DEPTH + 1 tokens
    for i, seq in enumerate(case.sequences):
        tokens, logits = draw(model, VOCAB, seq.length, np.random.default_rng(case.seed * 1000 + i),
                              tries=4000, continuation=CONTINUATION)
        n, length = len(tokens), seq.length
        rows = np.arange(length - 1, n - 1, dtype=np.int32)
        arrays[f"tokens_{i}"], arrays[f"positions_{i}"] = tokens, rows
        arrays[f"logits_{i}"] = logits[rows].astype(np.float32)
        # the draft's committed rows: row p holds token p + 1 over the base's features of position p
        with torch.no_grad():
            feats = draft.fc(_features(model, tokens[:-1], layers))
            t = torch.tensor(tokens[1:], dtype=torch.long)
            pos = torch.arange(n - 1)
            causal = torch.ones(n - 1, n - 1, dtype=torch.bool).tril()
            committed = draft.layer(t, feats, pos, causal)
            arrays[f"draft_logits_{i}"] = draft.logits(committed)[rows].numpy().astype(np.float32)
        # the replayed rounds
        c = length
        keys, key_logits, dkeys, dkey_logits, trees, parents_all, commits = [], [], [], [], [], [], []
        for _ in range(ROUNDS):
            toks, parents, accepted = _round_tree(model, tokens, logits, c, i)
            trees.append(toks)
            parents_all.append(parents)
            commits.append(c)
            outs: dict[int, Any] = {}
            for node in range(len(toks)):
                path = _path(toks, parents, node)
                if path != [int(x) for x in tokens[c:c + len(path)]]:
                    keys.append([c, *path, *[-1] * (width - 1 - len(path))])
                    key_logits.append(hf_logits(model, np.concatenate([tokens[:c], path]))[-1])
            # the draft tree: verify nodes 1.. level by level; node j at position c + depth - 1
            with torch.no_grad():
                for level in range(1, DEPTH + 1):
                    nodes = list(range(1 + (level - 1) * TOP_K, 1 + level * TOP_K))
                    every = list(range(1, 1 + level * TOP_K))
                    tree_tok = torch.tensor([toks[j] for j in every], dtype=torch.long)
                    hidden = torch.stack([committed[c - 1] if parents[j] == 0 else outs[parents[j]] for j in every])
                    depth = torch.tensor([len(_path(toks, parents, j)) - 2 for j in every])
                    m = len(every)
                    vis = torch.zeros(c + m, c + m, dtype=torch.bool)
                    vis[:c, :c] = causal[:c, :c]
                    vis[c:, :c] = True
                    for a, j in enumerate(every):
                        up = j
                        while up > 0:
                            vis[c + a, c + every.index(up)] = True
                            up = parents[up]
                    rows_in = torch.cat([t[:c], tree_tok])
                    hid_in = torch.cat([feats[:c], hidden])
                    pos_in = torch.cat([pos[:c], c + depth])
                    out_rows = draft.layer(rows_in, hid_in, pos_in, vis)[c:]
                    for a, j in enumerate(every):
                        if j in nodes:
                            outs[j] = out_rows[a]
                            dpath = _path(toks, parents, j)[1:]
                            dkeys.append([c, *dpath, *[-1] * (width - 1 - len(dpath))])
                            dkey_logits.append(draft.logits(out_rows[a]).numpy())
            c += accepted
        arrays[f"path_keys_{i}"] = np.array(keys, np.int32).reshape(-1, width)
        arrays[f"path_logits_{i}"] = np.array(key_logits, np.float32).reshape(-1, VOCAB)
        arrays[f"draft_path_keys_{i}"] = np.array(dkeys, np.int32).reshape(-1, width)
        arrays[f"draft_path_logits_{i}"] = np.array(dkey_logits, np.float32).reshape(-1, DRAFT_VOCAB)
        arrays[f"tree_tokens_{i}"] = np.array(trees, np.int32)
        arrays[f"tree_parents_{i}"] = np.array(parents_all, np.int32)
        arrays[f"tree_commits_{i}"] = np.array(commits, np.int32)
        greedy = logits[length - 1:n - 1]
        sequences.append({"purpose": seq.purpose, "prompt_length": length, "marks": [],
                          "smallest_greedy_gap": round(min(gap(r) for r in greedy), 4)})
    meta = {"sequences": sequences, "continuation": CONTINUATION,
            "spec": {"draft_top_k": TOP_K, "draft_step": DEPTH, "verify_size": VERIFY_SIZE, "rounds": ROUNDS,
                     "eagle_hidden_state_layers": layers}}
    return arrays, meta


NOTES = """Exported by two runs of the real exporter: `tensorrt-edgellm-export CKPT/draft OUT/draft`, then
`tensorrt-edgellm-export CKPT/base OUT/base --eagle-base --eagle-draft-dir CKPT/draft`. The base has 7 layers
because Edge-LLM's builder refuses repeated EAGLE3 target layers (`[2, n // 2, n - 3]` must be distinct).
Transformers has no EAGLE3 draft class: the draft's references come from `scripts/parity_cases/eagle3.py::
DraftReference` (the draft's forward in torch with transformers' Llama parts, over Hugging Face's base hidden
states)."""

CASES = [
    Case("qwen3-eagle3", "EAGLE3 pair: a Qwen3 base (7 layers of 64, QK norm, vocab 512) and a one-layer "
         "LlamaForCausalLMEagle3 draft (hidden 64, draft vocab 256 with d2t offsets).",
         checkpoint, {"base": Role("base/llm", BASE_BUILDER, "base", "eagle3", checkpoint="base"),
                      "draft": Role("draft/llm", DRAFT_BUILDER, "draft", "eagle3", checkpoint="draft")},
         export=export, sequences=SEQUENCES, reference=reference, notes=NOTES),
]
