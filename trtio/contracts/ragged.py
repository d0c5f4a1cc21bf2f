"""The token-major ("ragged") contract of Edge-LLM 0.11 engines (DESIGN §11; reference
``edge-llm-0.11-contract.md`` §3).

Activations are ``[T, H]`` with ``T = S * W`` physical rows: sequence ``s`` of a step occupies rows
``[s*W, (s+1)*W)`` (Edge-LLM's entry padding), so a step's dims are the batch-major ones read
token-major: ``T = batch * seq_len`` rows, ``R = batch * select_len`` logits rows. The KV state is a
paged pool per layer plus ``kv_page_table``; both belong to the engine state (:mod:`trtio.state`).

:func:`registry_for` gives every other binding an engine of this contract declares, with the shapes
of both optimization profiles exactly as Edge-LLM's builder sets them up (0 = prefill,
1 = generation); tests compare them with files the real exporter wrote.
"""

from __future__ import annotations

import math

from trtio import names
from trtio.config import LLMEngineConfig
from trtio.dtypes import DType
from trtio.registry import ProfileShapes, TensorRegistry, TensorSpec

__all__ = [
    "MAX_PHASE_EXTENT",
    "PHASE_DECODE",
    "PHASE_DRAFT",
    "PHASE_PREFILL",
    "PHASE_PREFILL_RESTORED",
    "PHASE_VERIFY",
    "output_hidden_width",
    "registry_for",
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


def output_hidden_width(cfg: LLMEngineConfig) -> int:
    """Width of a base engine's ``hidden_states`` output: EAGLE3 concatenates the hidden states of
    ``eagle_hidden_state_layers`` (3 of them: 3 * hidden_size); otherwise hidden_size."""
    layers = len(cfg.eagle_hidden_state_layers)
    return cfg.hidden_size * max(layers, 1)


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
    add(names.kRopeCosSin, "input", f32, (T, cfg.rotary_dim), rows(cfg.rotary_dim))
    add(names.kPositions, "input", i32, (T,), rows(), optional=True)
    add(names.kQueryStartOffsets, "input", i32, ("query_offsets_len",), seqs(1))
    add(names.kQueryLengths, "input", i32, (S,), seqs())
    add(names.kPastLengths, "input", i32, (S,), seqs())
    add(names.kAttentionSequenceLengths, "input", i32, (S,), seqs())
    add(names.kStateIndices, "input", i32, (S,), seqs(), optional=True)
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
        add(names.kOutputHiddenStates, "output", act, (T, output_hidden_width(cfg)))
    elif role == "draft":
        add(names.kOutputHiddenStates, "output", act, (R, cfg.hidden_size))
    return reg
