"""The token-major ("ragged") contract of Edge-LLM 0.11 engines (``docs/architecture.md``, "Contracts"; what
trtio assumes of Edge-LLM's runtime is in ``docs/edgellm-assumptions.md``).

Activations are ``[T, H]`` with ``T = S * W`` physical rows: sequence ``s`` of a step occupies rows
``[s*W, (s+1)*W)`` (Edge-LLM's entry padding), so a step's dims are the batch-major ones read
token-major: ``T = batch * seq_len`` rows, ``R = batch * select_len`` logits rows. The KV state is a
paged pool per layer plus ``kv_page_table``; both belong to the engine state (:mod:`trtio._state`).

:func:`registry_for` gives every other binding an engine of this contract declares, with the shapes
of both optimization profiles exactly as Edge-LLM's builder sets them up (0 = prefill,
1 = generation); tests compare them with files the real exporter wrote.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from trtio import names
from trtio._config import LLMEngineConfig
from trtio._dtypes import DType
from trtio._registry import ProfileShapes, TensorRegistry, TensorSpec
from trtio._staging import constant

__all__ = [
    "MAX_PHASE_EXTENT",
    "PHASE_DECODE",
    "PHASE_DRAFT",
    "PHASE_PREFILL",
    "PHASE_PREFILL_RESTORED",
    "PHASE_VERIFY",
    "StepLayout",
    "TreeLayout",
    "causal_step",
    "decode_step",
    "pack_rows",
    "packed_tree_step",
    "ramp",
    "registry_for",
    "tree_step",
]

# Execution phases, carried by the extent of execution_phase_marker (its payload is ignored).
PHASE_PREFILL = 1
PHASE_PREFILL_RESTORED = 2  # a prefill where some sequence already has cached tokens
PHASE_DECODE = 3
PHASE_DRAFT = 4  # draft proposal and draft catch-up (3 when the step is one token wide)
PHASE_VERIFY = 5
MAX_PHASE_EXTENT = 8  # the profiles' max: phases 6-8 (diffusion, rejected) are never produced here

T = ("batch", "seq_len")  # physical token rows
S = "batch"  # sequences
R = ("batch", "select_len")  # logits rows


def _half(x: int) -> int:
    return max(1, x // 2)


def registry_for(cfg: LLMEngineConfig) -> TensorRegistry:
    """The bindings (all but the paged KV state's) of a ragged engine of ``cfg.role``, with both
    profiles. B = max batch, L = max input length, Q = tokens per sequence in generation (1 for a
    plain LLM, ``max_verify_tree_size`` for a base, ``max_draft_tree_size`` for a draft)."""
    role = cfg.role
    spec_role = role != "llm"
    b, L, q = cfg.max_supported_batch_size, cfg.max_supported_input_length, cfg.max_step_tokens
    act, i32, i64, f32 = cfg.activation, DType.INT32, DType.INT64, DType.FLOAT32

    def rows(*rest: int) -> tuple[ProfileShapes, ...]:
        return (((1, *rest), (b * _half(L), *rest), (b * L, *rest)),
                ((1, *rest), (b * q, *rest), (b * q, *rest)))

    def seqs(extra: int = 0) -> tuple[ProfileShapes, ...]:
        one = ((1 + extra,), (b + extra,), (b + extra,))
        return (one, one)

    reg = TensorRegistry(role, contract="ragged")

    def add(name: str, io: str, dtype: DType, shape: tuple[int | str | tuple[str, ...], ...],
            profiles: tuple[ProfileShapes, ...] = (), optional: bool = False) -> None:
        reg.add(TensorSpec(name, io, dtype, shape, profiles if io == "input" else (), optional))

    add(names.kInputsEmbeds, "input", act, (T, cfg.hidden_size), rows(cfg.hidden_size))
    add(names.kRopeCosSin, "input", f32, (T, cfg.rotary_dim), rows(cfg.rotary_dim))  # a family may split it
    add(names.kPositions, "input", i32, (T,), rows(), optional=True)
    add(names.kQueryStartOffsets, "input", i32, ("query_offsets_len",), seqs(1))
    add(names.kQueryLengths, "input", i32, (S,), seqs())
    add(names.kPastLengths, "input", i32, (S,), seqs())
    add(names.kAttentionSequenceLengths, "input", i32, (S,), seqs())
    # Read by a hybrid model's recurrent layers (each sequence's state row); no dense graph reads it.
    add(names.kStateIndices, "input", i32, (S,), seqs(), optional=True)  # read by a family's per-slot state
    generation_phase = {"llm": PHASE_DECODE, "base": PHASE_VERIFY, "draft": PHASE_DRAFT}[role]
    add(names.kExecutionPhaseMarker, "input", i32, ("execution_phase_len",),
        (((1,), (1,), (MAX_PHASE_EXTENT,)), ((1,), (generation_phase,), (MAX_PHASE_EXTENT,))))
    add(names.kContextSequenceCountCarrier, "input", i32, ("context_seq_len",),
        (((1,), (b,), (b,)), ((0,), (0,), (0,))))
    add(names.kLogitsIndices, "input", i64, (R,), rows() if spec_role else seqs())
    if role == "draft":
        add(names.kBaseModelHiddenStates, "input", act, (T, cfg.base_model_hidden_size),
            rows(cfg.base_model_hidden_size))
        add(names.kDraftModelHiddenStates, "input", act, (T, cfg.hidden_size), rows(cfg.hidden_size))
    if spec_role:
        words = math.ceil(q / 32)
        add(names.kAttentionPositionIds, "input", i32, (T,), rows())
        add(names.kPackedAttentionMask, "input", i32, (T, "packed_mask_len"),
            (((1, 1), (b * _half(L), 1), (b * L, 1)), ((1, 1), (b * q, words), (b * q, words))))
        add(names.kTreeParentIds, "input", i32, (T,), rows(), optional=True)
        add(names.kTreeDepths, "input", i32, (T,), rows(), optional=True)
        add(names.kValidTreeCounts, "input", i32, (S,), seqs(), optional=True)
    for i in range(cfg.num_deepstack_features):
        add(names.deepstack_embeds(i), "input", act, (T, cfg.hidden_size), rows(cfg.hidden_size))
    add(names.kSkipSoftmaxScale, "input", DType.INT8, ("skip_softmax_scale_len",),
        (((0,), (0,), (1,)),) * 2, optional=True)
    add(names.kLogits, "output", f32, (R, cfg.output_vocab_size))
    if role == "base":
        add(names.kOutputHiddenStates, "output", act, (T, cfg.hidden_size))  # a family may widen it (EAGLE3)
    elif role == "draft":
        add(names.kOutputHiddenStates, "output", act, (R, cfg.hidden_size))
    for family in cfg.features:  # the bindings each family declares (a DFlash draft's: another registry)
        reg = family.registry(reg, cfg)
    return reg


# -- step inputs (host side): how Edge-LLM 0.11's runtime lays a step out --------------------------------


@dataclass
class StepLayout:
    """One step's per-step inputs, as host arrays (written into the PipelineIO's step block).

    ``width`` is the step's query width W; sequence ``s`` owns rows ``s*W .. s*W + W - 1``.
    ``tree`` arrays exist only for base / draft engines.
    """

    width: int
    phase: int
    query_start_offsets: np.ndarray  # int32 [S+1] = s*W
    query_lengths: np.ndarray  # int32 [S]
    past_lengths: np.ndarray  # int32 [S]
    attention_sequence_lengths: np.ndarray  # int32 [S]
    state_indices: np.ndarray  # int32 [S]
    logits_indices: np.ndarray  # int64 [R]
    positions: np.ndarray  # int32 [T], -1 on padding rows
    attention_position_ids: np.ndarray | None = None  # int32 [T]
    packed_mask: np.ndarray | None = None  # int32 [T, ceil(W/32)]
    tree_parent_ids: np.ndarray | None = None  # int32 [T]
    tree_depths: np.ndarray | None = None  # int32 [T]

    @property
    def batch(self) -> int:
        return int(self.query_lengths.shape[0])

    @property
    def rows(self) -> int:
        return self.batch * self.width


def _i32(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x, dtype=np.int32)


_CONSTANTS: dict[tuple[int, int, int, str], np.ndarray] = {}


def ramp(n: int, step: int = 1, start: int = 0, dtype: str = "i4") -> np.ndarray:
    """``start, start + step, ...`` (``n`` values) as a shared :func:`~trtio._staging.constant`: steps of one
    shape reuse the same object, which the step block then need not receive again."""
    key = (n, step, start, dtype)
    found = _CONSTANTS.get(key)
    if found is None:
        if len(_CONSTANTS) >= 1024:
            _CONSTANTS.clear()
        found = _CONSTANTS[key] = constant((start + step * np.arange(n, dtype=np.int64)).astype(dtype))
    return found


def _common(past: np.ndarray, qlen: np.ndarray, width: int, phase: int, slots: np.ndarray | None,
            logits_rows: np.ndarray, positions: np.ndarray) -> StepLayout:
    s = past.shape[0]
    asl = past + (qlen if phase <= PHASE_DECODE else width)  # phases 4-5: the kernel derives the prefix as asl - W
    return StepLayout(
        width=width, phase=phase,
        query_start_offsets=ramp(s + 1, width),
        query_lengths=_i32(qlen), past_lengths=_i32(past), attention_sequence_lengths=_i32(asl),
        state_indices=ramp(s) if slots is None else _i32(slots),
        logits_indices=np.ascontiguousarray(logits_rows, dtype=np.int64),
        positions=_i32(positions.reshape(-1)))


def causal_step(past: np.ndarray, lengths: np.ndarray, width: int, *, phase: int,
                slots: np.ndarray | None = None) -> StepLayout:
    """Prefill (phase 1, or 2 after a restored prefix) or decode (3): ``lengths[s]`` new tokens of sequence
    ``s`` after ``past[s]`` cached ones, entry-padded to ``width``; logits at each sequence's last token."""
    past, lengths = np.asarray(past, np.int64), np.asarray(lengths, np.int64)
    j = np.arange(width)[None, :]
    positions = np.where(j < lengths[:, None], past[:, None] + j, -1)
    rows = np.arange(past.shape[0]) * width + lengths - 1
    return _common(past, lengths, width, phase, slots, rows, positions)


def decode_step(past: np.ndarray) -> StepLayout:
    """A decode step (phase 3) of one token per sequence after ``past[s]`` cached ones: what
    :func:`causal_step` gives for ``lengths`` = 1 and ``width`` = 1, with the parts that depend on the batch
    alone shared between steps (:func:`~trtio._staging.constant`)."""
    s = past.shape[0]
    at = past.astype(np.int32)  # the token's position is its sequence's past length
    return StepLayout(width=1, phase=PHASE_DECODE, query_start_offsets=ramp(s + 1), query_lengths=ramp(s, 0, 1),
                      past_lengths=at, attention_sequence_lengths=at + 1, state_indices=ramp(s),
                      logits_indices=ramp(s, dtype="i8"), positions=at)


def pack_rows(visible: np.ndarray, width: int) -> np.ndarray:
    """Tree masks [S, N, N] (N <= width) packed as Edge-LLM reads them: uint32 [S, width, ceil(width/32)],
    bit i % 32 of word i // 32 set where a row sees node i; rows past N are zero."""
    s, n = visible.shape[0], visible.shape[1]
    words = max(1, -(-width // 32))
    bits = np.zeros((s, width, words * 32), np.uint32)
    bits[:, :n, :n] = visible
    packed: np.ndarray = np.bitwise_or.reduce(bits.reshape(s, width, words, 32) << np.arange(32, dtype=np.uint32),
                                              axis=3)
    return packed


# Per width (a catch-up's: a few): for each chain length L = 0 .. width, which of the width rows hold a node
# ([width + 1, width] bool) and their packed causal masks ([width + 1, width, words] int32); then each row's parent
# (row - 1) and depth (row), which every chain shares.
_CHAIN_ROWS: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = {}
# Per (sequences, width): the rows all chains of that shape share (TreeLayout.chains): depth [S, W], parent ids and
# depths [S*W], as constants.
_CHAIN_SHARED: dict[tuple[int, int], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}


def _chain_rows(width: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    found = _CHAIN_ROWS.get(width)
    if found is None:
        j = np.arange(width)
        take = j[None, :] < np.arange(width + 1)[:, None]
        causal = take[:, :, None] & take[:, None, :] & (j[None, :, None] >= j[None, None, :])
        packed = pack_rows(causal, width).view(np.int32)
        found = _CHAIN_ROWS[width] = (take, packed, j - 1, j)
    return found


@dataclass(frozen=True)
class TreeLayout:
    """A tree step's inputs that do not depend on what is cached, worked out once: a tree that repeats
    (a runtime's verify tree, a catch-up of the same lengths) is laid out once and completed per step by
    :meth:`at`. Its arrays are :func:`~trtio._staging.constant` s, so the step block receives them once."""

    width: int
    phase: int
    real: np.ndarray  # bool [S, W]: the rows that hold a node
    depth: np.ndarray  # int32 [S, W]
    query_lengths: np.ndarray  # int32 [S]
    logits_indices: np.ndarray  # int64 [R]
    packed_mask: np.ndarray  # int32 [S*W, words]
    tree_parent_ids: np.ndarray  # int32 [S*W]
    tree_depths: np.ndarray  # int32 [S*W]
    padding_position: int

    @classmethod
    def of(cls, packed: np.ndarray, depth: np.ndarray, real: np.ndarray, *, phase: int, logits_rows: np.ndarray,
           parents: np.ndarray | None = None, padding_position: int = -1, keep: bool = True) -> TreeLayout:
        """From packed rows (:func:`pack_rows`, uint32 [S, W, words]), each node's depth and which rows are
        real ([S, W]), absolute ``logits_rows`` and ``parents`` [S, W] (-1 for roots; a linear chain
        without them), see :func:`packed_tree_step`. ``keep``: copied into constants, to be reused; else
        the arrays may view the caller's (a one-off step)."""
        fix = constant if keep else np.ascontiguousarray
        s, width = real.shape
        if parents is None:  # a linear chain (Edge-LLM's default in phase 4)
            parent_ids = np.broadcast_to(np.arange(width) - 1, (s, width))
            depths = np.broadcast_to(np.arange(width), (s, width))
        else:
            parent_ids, depths = np.where(real, parents, -1), np.where(real, depth, 0)
        words = np.ascontiguousarray(packed, dtype=np.uint32).view(np.int32).reshape(s * width, -1)
        return cls(width, phase, fix(real), fix(np.asarray(depth, np.int32)), fix(real.sum(axis=1).astype(np.int32)),
                   fix(np.asarray(logits_rows, np.int64)), fix(words), fix(parent_ids.reshape(-1).astype(np.int32)),
                   fix(depths.reshape(-1).astype(np.int32)), padding_position)

    @classmethod
    def chains(cls, lengths: np.ndarray, width: int, *, phase: int, logits_rows: np.ndarray) -> TreeLayout:
        """Causal chains, ``lengths[s]`` nodes (1 .. ``width``) of sequence ``s`` in ``width``-wide rows (node t
        sees nodes 0 .. t; parent t - 1, depth t): what :meth:`of` makes of their masks without ``parents``, put
        together from rows made once per width (a catch-up of new accept lengths every round lays out fast)."""
        take, packed, parents, depths = _chain_rows(width)
        s = lengths.shape[0]
        shared = _CHAIN_SHARED.get((s, width))
        if shared is None:
            if len(_CHAIN_SHARED) >= 256:
                _CHAIN_SHARED.clear()
            shared = _CHAIN_SHARED[(s, width)] = (
                constant(np.broadcast_to(depths.astype(np.int32), (s, width))),
                constant(np.tile(parents.astype(np.int32), s)), constant(np.tile(depths.astype(np.int32), s)))
        depth, parent_ids, tree_depths = shared
        return cls(width, phase, constant(take[lengths]), depth, constant(lengths.astype(np.int32)),
                   constant(np.asarray(logits_rows, np.int64)), constant(packed[lengths].reshape(s * width, -1)),
                   parent_ids, tree_depths, -1)

    def at(self, past: np.ndarray, slots: np.ndarray | None = None) -> StepLayout:
        """The step with ``past[s]`` tokens cached per sequence: nodes written at ``past + t``, positions
        ``past + depth`` (-1 on padding rows; ``attention_position_ids`` has ``padding_position`` there)."""
        s, width = self.real.shape
        past32 = past.astype(np.int32)
        at = past32[:, None] + self.depth
        positions = np.where(self.real, at, np.int32(-1)).reshape(-1)
        ids = positions if self.padding_position == -1 else \
            np.where(self.real, at, np.int32(self.padding_position)).reshape(-1)
        asl = past32 + (self.query_lengths if self.phase <= PHASE_DECODE else np.int32(width))
        return StepLayout(width=width, phase=self.phase, query_start_offsets=ramp(s + 1, width),
                          query_lengths=self.query_lengths, past_lengths=past32, attention_sequence_lengths=asl,
                          state_indices=ramp(s) if slots is None else _i32(slots),
                          logits_indices=self.logits_indices, positions=positions, attention_position_ids=ids,
                          packed_mask=self.packed_mask, tree_parent_ids=self.tree_parent_ids,
                          tree_depths=self.tree_depths)


def packed_tree_step(past: np.ndarray, packed: np.ndarray, depth: np.ndarray, real: np.ndarray, *, phase: int,
                     logits_rows: np.ndarray, parents: np.ndarray | None = None, padding_position: int = -1,
                     slots: np.ndarray | None = None) -> StepLayout:
    """A tree step from its packed rows (:func:`pack_rows`, uint32 [S, W, words]), each node's depth and
    which rows are real ([S, W]): nodes written at ``past + t``, positions ``past + depth`` (-1 on padding
    rows; ``attention_position_ids`` has ``padding_position`` there), ``logits_rows`` absolute rows,
    ``parents`` [S, W] (-1 for roots) for the tree metadata (a linear chain without it)."""
    return TreeLayout.of(packed, depth, real, phase=phase, logits_rows=logits_rows, parents=parents,
                         padding_position=padding_position, keep=False).at(np.asarray(past, np.int64), slots)


def tree_step(past: np.ndarray, visible: np.ndarray, width: int, *, phase: int, logits_rows: np.ndarray,
              parents: np.ndarray | None = None, padding_position: int = -1,
              slots: np.ndarray | None = None) -> StepLayout:
    """A tree step (5: base verify, 4: draft proposal / catch-up) from unpacked masks ``visible`` [S, N, N]
    (row t sees node i; padding rows all False, N <= width); see :func:`packed_tree_step`."""
    s, n = visible.shape[0], visible.shape[1]
    real = np.zeros((s, width), bool)
    real[:, :n] = visible.any(axis=2)
    depth = np.zeros((s, width), np.int64)
    depth[:, :n] = visible.sum(axis=2) - 1
    par = None
    if parents is not None:
        par = np.full((s, width), -1, np.int64)
        par[:, :n] = parents
    return packed_tree_step(past, pack_rows(visible, width), depth, real, phase=phase, logits_rows=logits_rows,
                            parents=par, padding_position=padding_position, slots=slots)
