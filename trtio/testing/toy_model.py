"""The toy transformer behind trtio's toy engines, as plain numpy (the ground truth).

``docs/toy-model.md`` is the specification. Three implementations share it: this module (a full
recompute of one sequence, no KV cache), ``trtio.testing.ReferenceEngine`` (step by step, on raw
addresses) and ``trtio.testing.toy_build`` (a real TensorRT / TensorRT-RTX plan). All three take
their weights from :meth:`ToyWeights.generate`, so they agree bit for bit on the parameters.

Everything here is host-side numpy with float32 arithmetic. Configs are duck-typed: any object with
the ``LLMEngineConfig`` attributes (``hidden_size``, ``num_attention_heads``, ...) will do.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from trtio._dtypes import DType
from trtio.errors import ConfigError, InvalidValueError, ShapeError

__all__ = [
    "RecurrentWeights",
    "gdn_key_heads",
    "recurrent_token",
    "ATTN_SCALE",
    "DRAFT_MIX_SCALE",
    "MLP_SCALE",
    "ROPE_THETA",
    "ToyWeights",
    "apply_rope",
    "causal_visibility",
    "config_role",
    "log_softmax",
    "no_rope_table",
    "output_vocab_size",
    "reference_forward",
    "reference_logits",
    "rope_table",
    "toy_embedding",
]

ATTN_SCALE = 0.5
MLP_SCALE = 0.5
DRAFT_MIX_SCALE = 0.01
ROPE_THETA = 10000.0
_EMBEDDING_SEED_OFFSET = 7919
_RECURRENT_SEED_OFFSET = 104729  # the recurrent layers' weights have a generator of their own


def config_role(cfg: Any) -> str:
    """``"draft"`` for an EAGLE draft, ``"base"`` for a spec-decode base, else ``"llm"``."""
    if int(getattr(cfg, "base_model_hidden_size", 0) or 0) > 0:
        return "draft"
    if bool(getattr(cfg, "is_spec_decode_base", False)):
        return "base"
    return "llm"


def output_vocab_size(cfg: Any) -> int:
    """The logits width: ``cfg.output_vocab_size``, or ``cfg.vocab_size`` where that is unset or 0."""
    return int(getattr(cfg, "output_vocab_size", 0) or cfg.vocab_size)


def _draw(rng: np.random.Generator, shape: tuple[int, ...], scale: float) -> np.ndarray:
    # float32 draw times a float32 scale: the one recipe every implementation repeats exactly.
    return rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)


@dataclass(frozen=True, eq=False)
class RecurrentWeights:
    """One recurrent layer of a hybrid toy model (``docs/toy-model.md``, "Hybrid models"), float32, used as
    ``x @ w``. ``C`` = conv_dim, ``K`` = conv_kernel, ``Hh`` = recurrent_state_num_heads, ``D1`` =
    recurrent_state_head_dim, ``D2`` = recurrent_state_size. Gated DeltaNet: queries and keys ``[Hk, D1]``
    (:func:`gdn_key_heads`: value head ``j`` reads key head ``j // (Hh / Hk)``), values ``[Hh, D2]``. Mamba2: ``x``
    ``[Hh, D1]``, ``B`` and ``C`` ``[D2]`` shared by the heads."""

    kind: str  # "gated_deltanet" | "mamba2"
    w_in: np.ndarray  # [H, C]: the conv's input
    w_conv: np.ndarray  # [C, K]: the causal depthwise conv, oldest column first
    w_q: np.ndarray  # GDN: [C, Hk*D1] queries; Mamba2: [C, D2] its C (read-out)
    w_k: np.ndarray  # GDN: [C, Hk*D1] keys; Mamba2: [C, D2] its B (write-in)
    w_v: np.ndarray  # GDN: [C, Hh*D2] values; Mamba2: [C, Hh*D1] its x
    w_gate: np.ndarray  # [H, Hh]: GDN decay logits; Mamba2 dt logits
    w_beta: np.ndarray  # [H, Hh]: GDN write strength logits (unused by Mamba2)
    bias: np.ndarray  # [Hh]: Mamba2 dt bias (unused by GDN)
    a_log: np.ndarray  # [Hh]: Mamba2 A = -exp(a_log) (unused by GDN)
    d_skip: np.ndarray  # [Hh]: Mamba2 skip D (unused by GDN)
    w_out: np.ndarray  # GDN: [Hh*D2, H]; Mamba2: [Hh*D1, H]

    @classmethod
    def generate(cls, cfg: Any, rng: np.random.Generator) -> RecurrentWeights:
        """One layer's weights, drawn from ``rng`` in field order (``w_in`` .. ``w_out``)."""
        h, c, k = int(cfg.hidden_size), int(cfg.conv_dim), int(cfg.conv_kernel)
        hh, d1, d2 = (int(cfg.recurrent_state_num_heads), int(cfg.recurrent_state_head_dim),
                      int(cfg.recurrent_state_size))
        kind = str(cfg.recurrent_kind)
        gdn = kind == "gated_deltanet"
        hk = gdn_key_heads(c, hh, d1, d2)
        read, write, value = (hk * d1, hk * d1, hh * d2) if gdn else (d2, d2, hh * d1)
        return cls(kind=kind, w_in=_draw(rng, (h, c), 1.0 / math.sqrt(h)),
                   w_conv=_draw(rng, (c, k), 1.0 / math.sqrt(k)),
                   w_q=_draw(rng, (c, read), 1.0 / math.sqrt(c)), w_k=_draw(rng, (c, write), 1.0 / math.sqrt(c)),
                   w_v=_draw(rng, (c, value), 1.0 / math.sqrt(c)), w_gate=_draw(rng, (h, hh), 1.0 / math.sqrt(h)),
                   w_beta=_draw(rng, (h, hh), 1.0 / math.sqrt(h)), bias=_draw(rng, (hh,), 0.5),
                   a_log=_draw(rng, (hh,), 0.5), d_skip=_draw(rng, (hh,), 0.5),
                   w_out=_draw(rng, (value, h), ATTN_SCALE / math.sqrt(value)))


def gdn_key_heads(conv_dim: int, heads: int, d1: int, d2: int) -> int:
    """A Gated DeltaNet toy layer's key heads ``Hk``: as in Edge-LLM, where the conv runs over queries, keys and values
    together (``conv_dim = 2 Hk D1 + Hh D2``, ``Hh`` a multiple of ``Hk``); ``Hh`` where ``conv_dim`` says no such
    count (the toy's conv is a free width: it projects the conv's output rather than splitting it)."""
    rest = conv_dim - heads * d2
    if rest > 0 and rest % (2 * d1) == 0 and heads % (rest // (2 * d1)) == 0:
        return rest // (2 * d1)
    return heads


def _sigmoid(xp: Any, z: Any) -> Any:
    return 1.0 / (1.0 + xp.exp(-z))


def recurrent_token(xp: Any, mm: Any, w: Any, x: Any, conv: Any, state: Any, round_conv: Any,
                    round_state: Any, fields: list[Any] | None = None) -> tuple[Any, Any, Any]:
    """One token of a recurrent layer for ``N`` sequences at once (``docs/toy-model.md``, "Hybrid models").

    ``x`` float32 ``[N, H]`` (the residual stream), ``conv`` ``[N, C, K]`` and ``state`` ``[N, Hh, D1, D2]`` float32
    as stored. Returns ``(y, conv, state)``: the layer's output ``[N, H]`` (added to the stream by the caller) and
    the new states, rounded to their storage (``round_conv`` / ``round_state``: float32 -> float32 through the
    storage dtype) after every token, so that a sequence's states do not depend on how its tokens are split into
    steps. ``xp`` is numpy or CuPy, ``mm`` the matrix product; only element-wise ops besides (CUDA-graph safe).
    ``w`` holds the weights of :class:`RecurrentWeights` (as arrays of ``xp``). ``fields``, where given (a Gated
    DeltaNet layer), gets the token's update as Edge-LLM's tree verify stashes it: the L2-normalised keys ``[N, Hk,
    D1]``, the gate and beta ``[N, Hh]`` and the values ``[N, Hh, D2]`` (FP16 values, as the plugin reads them).
    """
    n = x.shape[0]
    hh, d1, d2 = state.shape[1], state.shape[2], state.shape[3]
    u = round_conv(mm(x, w.w_in))  # [N, C], as the conv state stores it
    conv = xp.concatenate([conv[:, :, 1:], u[:, :, None]], axis=2)
    c = (conv * w.w_conv[None]).sum(axis=2)
    c = c * _sigmoid(xp, c)  # SiLU
    if w.kind == "gated_deltanet":
        hk = w.w_k.shape[1] // d1  # key heads: value head j reads key head j // (Hh / Hk)
        q = mm(c, w.w_q).reshape(n, hk, d1)
        k = mm(c, w.w_k).reshape(n, hk, d1)
        q = q / xp.sqrt((q * q).sum(axis=2, keepdims=True) + 1e-6)
        k = k / xp.sqrt((k * k).sum(axis=2, keepdims=True) + 1e-6)
        if fields is not None:
            fields.append(k)
        if hk != hh:
            q, k = xp.repeat(q, hh // hk, axis=1), xp.repeat(k, hh // hk, axis=1)
        v = mm(c, w.w_v).reshape(n, hh, d2).astype(xp.float16).astype(xp.float32)  # the plugin's v is FP16
        decay = _sigmoid(xp, mm(x, w.w_gate))[:, :, None, None]  # [N, Hh, 1, 1]
        beta = _sigmoid(xp, mm(x, w.w_beta))[:, :, None]  # [N, Hh, 1]
        if fields is not None:
            fields += [decay[:, :, 0, 0], beta[:, :, 0], v]
        state = state * decay
        seen = (k[:, :, :, None] * state).sum(axis=2)  # [N, Hh, D2]: what the state holds at k
        state = round_state(state + k[:, :, :, None] * (beta * (v - seen))[:, :, None, :])
        out = (q[:, :, :, None] * state).sum(axis=2)  # [N, Hh, D2]
    else:
        xs = mm(c, w.w_v).reshape(n, hh, d1)
        b_in = mm(c, w.w_k)  # [N, D2]
        c_out = mm(c, w.w_q)
        z = mm(x, w.w_gate) + w.bias[None]
        dt = xp.where(z > 20.0, z, xp.log1p(xp.exp(xp.minimum(z, 20.0))))  # softplus
        decay = xp.exp(-xp.exp(w.a_log)[None] * dt)[:, :, None, None]
        state = round_state(state * decay + (dt[:, :, None] * xs)[:, :, :, None] * b_in[:, None, None, :])
        out = (state * c_out[:, None, None, :]).sum(axis=3) + w.d_skip[None, :, None] * xs  # [N, Hh, D1]
    y = mm(out.reshape(n, -1).astype(xp.float32), w.w_out)
    return y, conv, state


@dataclass(frozen=True, eq=False)
class ToyWeights:
    """Seeded parameters of the toy model (float32, row-major, used as ``x @ w``).

    Per-layer matrices are tuples indexed by layer. ``we``, ``wh`` and ``wd`` exist only for an
    EAGLE draft (``cfg.base_model_hidden_size > 0``) and are None otherwise.
    """

    wq: tuple[np.ndarray, ...]  # [H, Hq*D]
    wk: tuple[np.ndarray, ...]  # [H, Hkv*D]
    wv: tuple[np.ndarray, ...]  # [H, Hkv*D]
    wo: tuple[np.ndarray, ...]  # [Hq*D, H]
    w1: tuple[np.ndarray, ...]  # [H, F]
    w2: tuple[np.ndarray, ...]  # [F, H]
    we: np.ndarray | None  # [H, H]
    wh: np.ndarray | None  # [base_model_hidden_size, H]
    wd: np.ndarray | None  # [H, H]
    w_lm: np.ndarray  # [H, Vout]
    recurrent: tuple[RecurrentWeights, ...] = ()  # a hybrid model's recurrent layers, in order
    tok: np.ndarray | None = None  # [Vout, H]: a DFlash draft's token rows (its unrolled block's guesses)

    @property
    def num_layers(self) -> int:
        return len(self.wq)

    @property
    def is_draft(self) -> bool:
        return self.we is not None

    @classmethod
    def generate(cls, cfg: Any, seed: int = 0) -> ToyWeights:
        """Draw the weights of ``docs/toy-model.md`` from ``numpy.random.default_rng(seed)``.

        The draw order is part of the contract: for each layer in turn ``wq, wk, wv, wo, w1, w2``;
        then, for a draft only, ``we, wh, wd``; then ``w_lm``. A hybrid model's attention layers draw exactly
        that (``num_attention_layers`` of them); its recurrent layers then draw their :class:`RecurrentWeights`,
        one layer after the other, from ``numpy.random.default_rng(seed + 104729)``.
        """
        h = int(cfg.hidden_size)
        hq, hkv, d = int(cfg.num_attention_heads), int(cfg.num_kv_heads), int(cfg.head_dim)
        f = 2 * h
        vout = output_vocab_size(cfg)
        rng = np.random.default_rng(seed)
        per_layer: dict[str, list[np.ndarray]] = {k: [] for k in ("wq", "wk", "wv", "wo", "w1", "w2")}
        for _ in range(int(cfg.num_attention_layers)):
            per_layer["wq"].append(_draw(rng, (h, hq * d), 1.0 / math.sqrt(h)))
            per_layer["wk"].append(_draw(rng, (h, hkv * d), 1.0 / math.sqrt(h)))
            per_layer["wv"].append(_draw(rng, (h, hkv * d), 1.0 / math.sqrt(h)))
            per_layer["wo"].append(_draw(rng, (hq * d, h), ATTN_SCALE / math.sqrt(hq * d)))
            per_layer["w1"].append(_draw(rng, (h, f), 1.0 / math.sqrt(h)))
            per_layer["w2"].append(_draw(rng, (f, h), MLP_SCALE / math.sqrt(f)))
        we = wh = wd = None
        if config_role(cfg) == "draft":
            hb = int(cfg.base_model_hidden_size)
            we = _draw(rng, (h, h), 1.0 / math.sqrt(h))
            wh = _draw(rng, (hb, h), 1.0 / math.sqrt(hb))
            wd = _draw(rng, (h, h), 1.0 / math.sqrt(h))
        w_lm = _draw(rng, (h, vout), 1.0 / math.sqrt(h))
        recurrent: tuple[RecurrentWeights, ...] = ()
        n_recurrent = int(getattr(cfg, "num_recurrent_layers", 0) or 0)
        if n_recurrent:  # a generator of their own: a hybrid's attention layers draw what a dense model's do
            rec_rng = np.random.default_rng(seed + _RECURRENT_SEED_OFFSET)
            recurrent = tuple(RecurrentWeights.generate(cfg, rec_rng) for _ in range(n_recurrent))
        return cls(wq=tuple(per_layer["wq"]), wk=tuple(per_layer["wk"]), wv=tuple(per_layer["wv"]),
                   wo=tuple(per_layer["wo"]), w1=tuple(per_layer["w1"]), w2=tuple(per_layer["w2"]), we=we, wh=wh,
                   wd=wd, w_lm=w_lm, recurrent=recurrent)

    @classmethod
    def generate_draft(cls, cfg: Any, base: ToyWeights, seed: int = 0) -> ToyWeights:
        """An EAGLE draft derived from ``base``'s own weights, so that it agrees with the base's next step.

        The draft is the base cut after its first ``cfg.num_attention_layers`` layers (all of them when
        the draft has as many layers as the base, as the toy engines' drafts do): its layers are the
        base's, ``we`` is the identity (the draft takes the next token's embedding, as the base's own
        next step does) and ``w_lm`` is the base's. Fed the prompt shifted by one token (EAGLE), a full
        copy computes the base over every token but the first, so its guesses are the base's next
        tokens except where the first token tips the choice (the toy's attention spreads over the whole
        context, so that happens mostly early in short sequences). ``wh`` and ``wd`` keep the base's
        hidden states and the draft's own in play without overruling the copy: draws of
        ``numpy.random.default_rng(seed)`` (``wh`` first, then ``wd``) of the scales of
        :meth:`generate` times ``DRAFT_MIX_SCALE``.

        The draft must have the base's attention and MLP geometry (its layers are used as they are), at
        most as many layers, and the base's logits width. Raises :class:`~trtio.ConfigError` naming the
        field otherwise.
        """
        if config_role(cfg) != "draft":
            raise ConfigError("base_model_hidden_size", "generate_draft needs an EAGLE draft config "
                                                        "(base_model_hidden_size > 0)")
        h = int(cfg.hidden_size)
        hq, hkv, d = int(cfg.num_attention_heads), int(cfg.num_kv_heads), int(cfg.head_dim)
        layers = int(cfg.num_attention_layers)
        if not 1 <= layers <= base.num_layers:
            raise ConfigError("num_attention_layers", f"the draft copies the base's first layers: {layers} must be "
                                                      f"in 1..{base.num_layers} (the base's layer count)")
        shapes = {"wq": (h, hq * d), "wk": (h, hkv * d), "wv": (h, hkv * d), "wo": (hq * d, h), "w1": (h, 2 * h),
                  "w2": (2 * h, h)}
        for name, shape in shapes.items():
            got = getattr(base, name)[0].shape
            if got != shape:
                raise ConfigError("hidden_size", f"the draft copies the base's layers, but the base's {name} is "
                                                 f"{list(got)} where this draft (hidden_size {h}, {hq} heads, {hkv} "
                                                 f"KV heads of {d}) needs {list(shape)}")
        vout = output_vocab_size(cfg)
        if base.w_lm.shape != (h, vout):
            raise ConfigError("output_vocab_size", f"the draft shares the base's LM head {list(base.w_lm.shape)}, "
                                                   f"but this draft's logits are [{h}, {vout}]")
        hb = int(cfg.base_model_hidden_size)
        rng = np.random.default_rng(seed)
        wh = _draw(rng, (hb, h), DRAFT_MIX_SCALE / math.sqrt(hb))
        wd = _draw(rng, (h, h), DRAFT_MIX_SCALE / math.sqrt(h))
        return cls(wq=base.wq[:layers], wk=base.wk[:layers], wv=base.wv[:layers], wo=base.wo[:layers],
                   w1=base.w1[:layers], w2=base.w2[:layers], we=np.eye(h, dtype=np.float32), wh=wh, wd=wd,
                   w_lm=base.w_lm)


    @classmethod
    def generate_dflash_draft(cls, cfg: Any, base: ToyWeights, embedding: np.ndarray, mask_token_id: int,
                              seed: int = 0, *, base_cfg: Any) -> ToyWeights:
        """A DFlash block draft derived from ``base`` (``docs/toy-model.md``, "DFlash drafts"): the EAGLE draft of
        :meth:`generate_draft` (the base's first attention layers, ``we`` the identity, the base's LM head) whose
        ``tok`` rows are ``embedding - embedding[mask]`` (a mask row of its unrolled block enters the layers as the
        embedding of the guess before it) and whose ``wh`` (the delta's projection ``[len(target layers) x H, H]``)
        makes each of its layers write, from the base's features of a token, the keys and values the base's
        attention layer writes for it: the least-squares fit over 8 sequences of 48 tokens (``default_rng(seed)``)
        run through ``base_cfg`` (the base's config: its ``eagle_hidden_state_layers`` and, for a hybrid, its
        ``layer_types``; the stream entering a base attention layer follows its recurrent layers)."""
        draft = cls.generate_draft(cfg, base, seed)
        h = int(cfg.hidden_size)
        table = np.asarray(embedding, np.float32)
        if table.shape != (output_vocab_size(cfg), h) or not 0 <= int(mask_token_id) < table.shape[0]:
            raise ConfigError("dflash_config.mask_token_id", f"the toy DFlash draft needs the [vocab, hidden] "
                                                             f"embedding and a mask token in it, got "
                                                             f"{list(table.shape)} and {mask_token_id}")
        types = tuple(getattr(base_cfg, "layer_types", ()) or ()) or ("attention",) * base.num_layers
        entering = [m for m, kind in enumerate(types) if kind == "attention"][:draft.num_layers]
        targets = tuple(int(i) for i in base_cfg.eagle_hidden_state_layers)
        kv = [np.concatenate([draft.wk[i], draft.wv[i]], 1) for i in range(draft.num_layers)]  # the base's too
        proj = np.concatenate(kv, 1).astype(np.float64)  # [H, layers x 2 x Hkv*D]: c -> every layer's k and v
        feats, want = [], []
        for row in np.random.default_rng(seed).integers(0, table.shape[0], (8, 48)):
            x = table[row].astype(np.float16)
            after = np.split(reference_forward(base, base_cfg, x, hidden_after=range(len(types)))[0], len(types), 1)
            streams = [x.astype(np.float32), *after]  # streams[m]: the stream entering mixer m
            feats.append(np.concatenate([after[i] for i in targets], 1))
            want.append(np.concatenate([streams[m] @ kv[i] for i, m in enumerate(entering)], 1))
        f, y = np.concatenate(feats).astype(np.float64), np.concatenate(want).astype(np.float64)
        # min |f @ wh @ proj - y|: wh = f+ y proj+, each pseudo-inverse a little ridged
        fy = np.linalg.solve(f.T @ f + 1e-3 * np.eye(f.shape[1]), f.T @ y)
        wh = np.linalg.solve(proj @ proj.T + 1e-6 * np.eye(h), (fy @ proj.T).T).T
        return dataclasses.replace(draft, wh=wh.astype(np.float32), tok=table - table[int(mask_token_id)])


def toy_embedding(vocab: int, hidden: int, seed: int = 0) -> np.ndarray:
    """The token embedding table runtimes and the demo use: float32 ``[vocab, hidden]``.

    Drawn from its own generator (``default_rng(seed + 7919)``) so it never shifts the weights.
    """
    rng = np.random.default_rng(int(seed) + _EMBEDDING_SEED_OFFSET)
    return rng.standard_normal((int(vocab), int(hidden)), dtype=np.float32)


def rope_table(max_positions: int, rotary_dim: int, theta: float = ROPE_THETA) -> np.ndarray:
    """The ``rope_rotary_cos_sin`` table trtio fills: float32 ``[1, max_positions, rotary_dim]``.

    ``[0, p, i] = cos(p * theta**(-2i/R))`` and ``[0, p, R/2 + i] = sin(...)`` for ``i < R/2``
    (angles in float64, rounded once to float32).
    """
    r = int(rotary_dim)
    if r <= 0 or r % 2:
        raise InvalidValueError(f"rotary_dim must be a positive even number, got {rotary_dim}")
    inv_freq = float(theta) ** (-np.arange(0, r, 2, dtype=np.float64) / r)  # [R/2]
    angles = np.arange(int(max_positions), dtype=np.float64)[:, None] * inv_freq[None, :]
    table = np.concatenate([np.cos(angles), np.sin(angles)], axis=-1)
    return table.astype(np.float32)[None]


def no_rope_table(max_positions: int, rotary_dim: int) -> np.ndarray:
    """The table of a model without RoPE (``use_rope: false``): float32 ``[1, max_positions, rotary_dim]``, cos 1
    and sin 0 in every row, so rotating by it changes nothing (what Hugging Face's Nemotron-H computes, and the
    table Edge-LLM's runtime feeds such a model)."""
    r = int(rotary_dim)
    if r <= 0 or r % 2:
        raise InvalidValueError(f"rotary_dim must be a positive even number, got {rotary_dim}")
    table = np.zeros((1, int(max_positions), r), np.float32)
    table[..., :r // 2] = 1.0
    return table


def apply_rope(t: np.ndarray, cos_sin: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """Rotate-half RoPE on the first ``R`` dims of each head; returns a new float32 array.

    ``t``: ``[T, heads, D]``; ``cos_sin``: ``[P, R]`` (one batch row of the table);
    ``positions``: ``[T]`` integer rows of ``cos_sin``. Dims ``R..D`` are copied unchanged.
    """
    t = np.asarray(t, dtype=np.float32)
    cos_sin = np.asarray(cos_sin, dtype=np.float32)
    positions = np.asarray(positions)
    r = cos_sin.shape[-1]
    half = r // 2
    if r > t.shape[-1]:
        raise ShapeError(f"rotary dim {r} exceeds head dim {t.shape[-1]}")
    if positions.shape != (t.shape[0],):
        raise ShapeError(f"positions shape {positions.shape} does not match {t.shape[0]} tokens")
    if positions.size and (positions.min() < 0 or positions.max() >= cos_sin.shape[0]):
        raise InvalidValueError(
            f"positions span [{positions.min()}, {positions.max()}] but the RoPE table has "
            f"{cos_sin.shape[0]} rows"
        )
    c = cos_sin[positions, :half][:, None, :]  # [T, 1, R/2], broadcast over heads
    sn = cos_sin[positions, half:r][:, None, :]
    t1 = t[..., :half]
    t2 = t[..., half:r]
    out = t.copy()
    out[..., :half] = t1 * c - t2 * sn
    out[..., half:r] = t2 * c + t1 * sn
    return out


def causal_visibility(num_tokens: int) -> np.ndarray:
    """``[T, T]`` bool, row ``s`` sees key ``j`` iff ``j <= s``."""
    return np.tril(np.ones((num_tokens, num_tokens), dtype=bool))


def _as_f32(name: str, x: Any, shape: tuple[int, ...]) -> np.ndarray:
    arr = np.asarray(x).astype(np.float32)
    if arr.shape != shape:
        raise ShapeError(f"{name} has shape {arr.shape}, expected {shape}")
    return arr


def _round_to(x: np.ndarray, dtype: DType) -> np.ndarray:
    np_dtype = dtype.numpy
    if np_dtype is None:
        raise ConfigError("kv_cache_dtype", f"no numpy type for {dtype} (install ml_dtypes)")
    return x.astype(np_dtype).astype(np.float32)


def _first_stream(weights: ToyWeights, cfg: Any, x_in: np.ndarray, hidden_input: Any,
                  hidden_from_draft: Any) -> np.ndarray:
    """The residual stream entering the first layer: the embeddings, or a draft's mix of them with the base's
    hidden states and its own (``hidden_input``, ``hidden_from_draft``: a draft's, and only a draft's)."""
    t, h = x_in.shape
    if config_role(cfg) != "draft":
        if hidden_input is not None or hidden_from_draft is not None:
            raise InvalidValueError("hidden_input / hidden_from_draft are for draft models only")
        return x_in
    if hidden_input is None or hidden_from_draft is None:
        raise InvalidValueError("a draft model needs hidden_input and hidden_from_draft")
    hb = int(cfg.base_model_hidden_size)
    assert weights.we is not None and weights.wh is not None and weights.wd is not None
    x: np.ndarray = (x_in @ weights.we + _as_f32("hidden_input", hidden_input, (t, hb)) @ weights.wh
                     + _as_f32("hidden_from_draft", hidden_from_draft, (t, h)) @ weights.wd)
    return x


def _deepstack_features(weights: ToyWeights, nd: int, deepstack: Sequence[Any] | None, t: int,
                        h: int) -> list[np.ndarray]:
    """The ``nd`` deepstack features ``[T, H]`` as float32 (added after the first ``nd`` layers)."""
    if nd > weights.num_layers:
        raise ConfigError("num_deepstack_features",
                          f"num_deepstack_features={nd} exceeds the {weights.num_layers} layers")
    if not nd:
        if deepstack:
            raise InvalidValueError("deepstack given but num_deepstack_features is 0")
        return []
    if deepstack is None or len(deepstack) != nd:
        got = "None" if deepstack is None else f"{len(deepstack)} arrays"
        raise InvalidValueError(f"num_deepstack_features={nd} needs {nd} deepstack arrays, got {got}")
    return [_as_f32(f"deepstack[{i}]", a, (t, h)) for i, a in enumerate(deepstack)]


def _positions_and_rope(cfg: Any, t: int, positions: Any, rope: Any) -> tuple[np.ndarray, np.ndarray]:
    """The ``T`` tokens' positions (default ``arange(T)``) and the RoPE table ``[P, R]`` they index (default
    :func:`rope_table`, long enough for them)."""
    pos = np.arange(t) if positions is None else np.asarray(positions).astype(np.int64)
    if pos.shape != (t,):
        raise ShapeError(f"positions has shape {pos.shape}, expected ({t},)")
    if rope is None:
        rows = max(int(getattr(cfg, "max_kv_cache_capacity", 0) or 0), int(pos.max(initial=0)) + 1)
        if not bool(getattr(cfg, "use_rope", True)):
            return pos, no_rope_table(rows, int(cfg.rotary_dim))[0]
        return pos, rope_table(rows, int(cfg.rotary_dim))[0]
    table = np.asarray(rope, dtype=np.float32)
    if table.ndim == 3:
        if table.shape[0] != 1:
            raise ShapeError(f"rope table for one sequence must be [1, P, R], got {table.shape}")
        table = table[0]
    if table.ndim != 2 or table.shape[-1] != int(cfg.rotary_dim):
        raise ShapeError(f"rope table shape {table.shape} does not end in rotary_dim={cfg.rotary_dim}")
    return pos, table


def reference_forward(
    weights: ToyWeights,
    cfg: Any,
    embeds: Any,
    *,
    positions: Any = None,
    hidden_input: Any = None,
    hidden_from_draft: Any = None,
    deepstack: Sequence[Any] | None = None,
    rope: Any = None,
    visible: Any = None,
    hidden_after: Sequence[int] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Run the toy model on ONE sequence of ``T`` tokens from scratch (no cache).

    ``embeds`` ``[T, H]``; a draft also needs ``hidden_input`` ``[T, base_model_hidden_size]`` and
    ``hidden_from_draft`` ``[T, H]``; a model with ``num_deepstack_features = Nd > 0`` needs
    ``deepstack``, ``Nd`` arrays ``[T, H]``. Inputs in any float dtype are cast to float32 as given.
    ``positions`` (``[T]``, default ``arange(T)``) are RoPE rows of ``rope`` (``[P, R]`` or
    ``[1, P, R]``; default :func:`rope_table` long enough for ``positions``, :func:`no_rope_table` for a model
    with ``use_rope`` false). Every attention layer rotates q and k by the rows of the table given, whatever
    ``use_rope`` says, as Edge-LLM's attention plugin does (the graph feeds it the table; no attribute turns the
    rotation off): the table decides. ``visible`` (``[T, T]``
    bool, default causal) says which earlier tokens each token attends to; pass a tree mask here to
    ground-truth a spec-decode verify step. K and V are rounded to ``cfg.kv_cache_dtype`` before
    attention, as a cache of that type would store them. A token that sees no key gets zeros from
    attention.

    Returns ``(hidden, logits)``: float32 ``[T, H]`` (the final residual stream, before any cast to
    the activation dtype) and float32 ``[T, Vout]`` for every token. With ``hidden_after`` (layer
    indices, e.g. an EAGLE3 base's ``eagle_hidden_state_layers``; a hybrid model's recurrent layers are
    counted, as its engine counts them) ``hidden`` is instead ``[T, len(hidden_after) * H]``: the
    residual stream after each of those layers (its deepstack feature added), concatenated in the
    order given; the logits are unchanged.
    """
    h = int(cfg.hidden_size)
    hq, hkv, d = int(cfg.num_attention_heads), int(cfg.num_kv_heads), int(cfg.head_dim)
    nd = int(getattr(cfg, "num_deepstack_features", 0) or 0)
    kv_dtype = DType.coerce(cfg.kv_cache_dtype)
    if hq % hkv:
        raise ConfigError("num_kv_heads", f"num_attention_heads={hq} is not a multiple of num_kv_heads={hkv}")
    group = hq // hkv

    x_in = np.asarray(embeds)
    if x_in.ndim != 2:
        raise ShapeError(f"embeds must be [T, H], got shape {x_in.shape}")
    t = x_in.shape[0]
    x_in = _as_f32("embeds", x_in, (t, h))

    x = _first_stream(weights, cfg, x_in, hidden_input, hidden_from_draft)
    ds = _deepstack_features(weights, nd, deepstack, t, h)
    pos, table = _positions_and_rope(cfg, t, positions, rope)
    vis = causal_visibility(t) if visible is None else np.asarray(visible, dtype=bool)
    if vis.shape != (t, t):
        raise ShapeError(f"visible has shape {vis.shape}, expected ({t}, {t})")

    inv_sqrt_d = np.float32(1.0 / math.sqrt(d))
    types = tuple(getattr(cfg, "layer_types", ()) or ()) or ("attention",) * weights.num_layers
    after = [] if hidden_after is None else [int(i) for i in hidden_after]
    if any(not 0 <= i < len(types) for i in after):
        raise InvalidValueError(f"hidden_after {after} names layers outside 0..{len(types) - 1}")
    captured: dict[int, np.ndarray] = {}
    mixers = [i for i, kind in enumerate(types) if kind == "attention"]  # attention layer l is mixer mixers[l]
    recurrent = iter(weights.recurrent)
    for mixer, kind in enumerate(types):
        if kind != "attention":
            x = x + _recurrent_layer(next(recurrent), cfg, x)
            if mixer in after:
                captured[mixer] = x.astype(np.float32)
            continue
        layer = mixers.index(mixer)
        q = (x @ weights.wq[layer]).reshape(t, hq, d)
        k = (x @ weights.wk[layer]).reshape(t, hkv, d)
        v = (x @ weights.wv[layer]).reshape(t, hkv, d)
        q = apply_rope(q, table, pos)  # by the table given, whatever use_rope says (as Edge-LLM's plugin does)
        k = apply_rope(k, table, pos)
        k = _round_to(k, kv_dtype)
        v = _round_to(v, kv_dtype)
        attn = np.zeros((t, hq, d), dtype=np.float32)
        for head in range(hq):
            kh, vh = k[:, head // group, :], v[:, head // group, :]
            scores = (q[:, head, :] @ kh.T) * inv_sqrt_d  # [T, T]
            scores = np.where(vis, scores, -np.inf)
            row_max = scores.max(axis=1, keepdims=True)
            seen = np.isfinite(row_max)
            p = np.exp(scores - np.where(seen, row_max, 0.0))
            denom = p.sum(axis=1, keepdims=True)
            p = np.where(seen, p / np.where(seen, denom, 1.0), 0.0).astype(np.float32)
            attn[:, head, :] = p @ vh
        x = x + attn.reshape(t, hq * d) @ weights.wo[layer]
        x = x + np.maximum(x @ weights.w1[layer], 0.0) @ weights.w2[layer]
        if layer < nd:
            x = x + ds[layer]
        if mixer in after:
            captured[mixer] = x.astype(np.float32)
    x = x.astype(np.float32)
    logits = (x @ weights.w_lm).astype(np.float32)
    if hidden_after is not None:
        return np.concatenate([np.zeros((t, 0), np.float32)] + [captured[i] for i in after], axis=-1), logits
    return x, logits


def _recurrent_layer(w: RecurrentWeights, cfg: Any, x: np.ndarray) -> np.ndarray:
    """A recurrent layer's output ``[T, H]`` over one sequence, token by token from zero states."""
    conv_dtype, state_dtype = DType.coerce(cfg.conv_state_dtype), DType.coerce(cfg.recurrent_state_dtype)
    conv = np.zeros((1, int(cfg.conv_dim), int(cfg.conv_kernel)), np.float32)
    state = np.zeros((1, int(cfg.recurrent_state_num_heads), int(cfg.recurrent_state_head_dim),
                      int(cfg.recurrent_state_size)), np.float32)
    out = np.zeros_like(x)
    for i in range(x.shape[0]):
        y, conv, state = recurrent_token(np, np.matmul, w, x[i:i + 1], conv, state,
                                         lambda a: _round_to(a, conv_dtype), lambda a: _round_to(a, state_dtype))
        out[i] = y[0]
    return out


def log_softmax(logits: Any) -> np.ndarray:
    """``log_softmax`` over the last axis (float64 inside, float32 out): what an EAGLE draft's
    ragged engine returns as its logits."""
    z: np.ndarray = np.asarray(logits, dtype=np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    out: np.ndarray = (z - np.log(np.exp(z).sum(axis=-1, keepdims=True))).astype(np.float32)
    return out


def reference_logits(weights: ToyWeights, cfg: Any, embeds: Any, **kwargs: Any) -> np.ndarray:
    """:func:`reference_forward`'s logits only (``[T, Vout]`` float32)."""
    return reference_forward(weights, cfg, embeds, **kwargs)[1]
