"""What an engine contract is: the object a setup binds once and calls for everything that differs.

A contract (:class:`Contract`) says which bindings an engine of each role declares (its registry), how
a :class:`~trtio._pipeline_io.PipelineIO` lays its worst-case buffers out for it (:class:`PipelineLayout`),
how a tensor map binds them, and, per setup, how each step's inputs are staged (:class:`StepInputs`:
prefill, decode, tree steps, draft-tree levels). The setups call these and never ask which contract
they hold, so a new contract is a new module here (``docs/architecture.md`` says what it takes).
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import numpy as np

from trtio import names
from trtio._cache import BoundedCache
from trtio._config import DeploymentConfig, LLMEngineConfig
from trtio._contracts.ragged import TreeLayout, ramp
from trtio._cuda.backend import Location
from trtio._dtypes import DType
from trtio._memory import TensorRequest
from trtio._ops import CatchUpLayout, RowCopy, TreeStep
from trtio._registry import TensorRegistry
from trtio._staging import constant
from trtio._stream import Stream, StreamLike
from trtio.errors import TrtioError

if TYPE_CHECKING:
    from trtio._engine import DeviceWork
    from trtio._ops import CatchUpTargets, DraftTreeBuffers, TreeTargets
    from trtio._staging import StepStaging
    from trtio._state import EngineState
    from trtio._tensor import Tensor
    from trtio._tensor_map import TensorMap

__all__ = ["PAGE_TABLE_NAMES", "ROUND_NEXT", "SEED_STAGING_PAIRS",
           "Contract", "DraftLevelPlan", "EngineView", "Pipeline", "PipelineLayout", "StepInputs",
           "absent"]


class Pipeline(Protocol):
    """What a contract reads of a :class:`~trtio._pipeline_io.PipelineIO`: its sizes, its step block, the
    members it binds and stages (the seed's, and its own layout's), and the seed's staging calls. The
    PipelineIO is built from the contract's layout (:meth:`Contract.pipeline_layout`), so the members a
    contract names are there."""

    max_batch: int
    is_spec_decode: bool
    step: StepStaging | None
    select_token_indices: Tensor
    context_lengths: Tensor
    mrope_cos_sin: Tensor
    packed_attention_mask: Tensor
    spec_decode_position_ids: Tensor
    draft_hidden_states_in: Tensor
    draft_hidden_states_out: Tensor
    base_hidden_states: Tensor
    row_scratch: Tensor
    row_src: Tensor
    row_dst: Tensor

    def member(self, name: str) -> Tensor:
        """The member tensor ``name`` (a contract's own: ``query_start_offsets``, ``positions``, ...)."""

    def upload_context_lengths(self, values: np.ndarray, stream: StreamLike = None) -> Tensor:
        """Stage the batch contract's context lengths."""

    def upload_select_token_indices(self, values: np.ndarray, stream: StreamLike = None) -> Tensor:
        """Stage the batch contract's token selection."""


class EngineView(Protocol):
    """What a step writer reads of a bound engine: its role (``"llm"``, ``"base"``, ``"draft"``), config,
    KV state, and whether its prefill profile lets ``kvcache_start_index`` be empty (an empty cache)."""

    role: str
    cfg: LLMEngineConfig
    state: EngineState
    empty_start_ok: bool


def absent(name: str, dtype: DType, location: Location = Location.DEVICE) -> TensorRequest:
    """A member this layout does not have: an empty tensor, no allocation."""
    return TensorRequest(name, (0,), dtype, location)


@dataclass
class PipelineLayout:
    """A PipelineIO's worst case on one contract: its arena's requests (every member, empty ones
    included), the per-step inputs staged together (:class:`~trtio._staging.StepStaging`), the members a
    user sees as attributes beyond the seed's (arena tensors or step-block tensors), the members zeroed at
    creation, the staging pairs beyond the seed's, and the sizes."""

    title: str
    requests: list[TensorRequest]
    step_requests: list[TensorRequest]
    max_batch: int
    max_seq: int
    hidden_size: int
    is_spec_decode: bool
    num_deepstack: int
    members: tuple[str, ...] = ()
    zeroed: tuple[str, ...] = ()
    #: Device members the host stages values into, each through a private ring, and the pinned member that keeps
    #: the host's copy of the values last staged there (the seed's ``host_context_lengths``): (twin, device).
    staging_pairs: tuple[tuple[str, str], ...] = ()
    #: Members of the seed this contract does not use: reading one raises NotAvailableError naming the contract.
    unavailable: tuple[str, ...] = ()


@dataclass(slots=True)
class DraftLevelPlan:
    """What a proposal level's staging needs: the round's cached lengths (``past``, int32 constant), the
    level's ``parents``, its place in the round
    (nodes ``n0 .. n0 + k - 1`` of ``batch`` sequences), the previous level (``level``: its first node and
    count, where the parents' hidden rows are) and each sequence's root hidden row (``roots``). ``caught_up``:
    the round's lengths are ``past`` on the device already, where the last catch-up left them
    (:data:`ROUND_NEXT`): a round's first level reads them there and stages none."""

    past: np.ndarray
    parents: np.ndarray
    batch: int
    n0: int
    k: int
    roots: np.ndarray
    level: tuple[int, int] = (0, 0)
    slots: np.ndarray | None = None
    pages: np.ndarray | None = None  # the step's page-table rows (pages on demand), None: not staged
    caught_up: bool = False


class Contract(abc.ABC):
    """One engine I/O contract (see module docstring). Stateless: one instance per contract."""

    name: ClassVar[str]
    #: The KV state an engine of this contract declares: ``"paged"`` pools or ``"contiguous"`` caches.
    kv_layout: ClassVar[str]
    #: Whether a step may run any subset of the sequence slots (admission, release, pages on demand).
    slotted: ClassVar[bool]

    @abc.abstractmethod
    def registry(self, cfg: LLMEngineConfig) -> TensorRegistry:
        """The PipelineIO-owned bindings an engine of ``cfg.role`` declares (the engine state adds its own)."""

    @abc.abstractmethod
    def pipeline_layout(self, base: LLMEngineConfig, bundle: DeploymentConfig | None,
                        max_batch: int) -> PipelineLayout:
        """The worst-case buffers of a PipelineIO for one LLM (``bundle`` None) or a spec-decode pair."""

    @abc.abstractmethod
    def bind_pipeline(self, io: Pipeline, tm: TensorMap, cfg: LLMEngineConfig) -> None:
        """Add this contract's PipelineIO bindings for an engine of ``cfg`` to ``tm`` (beyond the
        embeddings, logits and deepstack features every contract binds alike)."""

    @abc.abstractmethod
    def binds_rope_table(self, cfg: LLMEngineConfig) -> bool:
        """Whether the engine binds the setup's shared RoPE table itself (else its steps gather rows of it)."""

    @abc.abstractmethod
    def steps(self, io: Pipeline, rope_table: Callable[[LLMEngineConfig, Stream], Tensor]) -> StepInputs:
        """A setup's step-input writer on this contract (one per setup)."""

    def page_table(self, io: Pipeline, role: str) -> Tensor | None:
        """The page table a paged engine of ``role`` binds, staged per step with its sequences' rows (pages
        on demand); None: the engine state keeps a fixed table of its own."""
        return None

    def catch_up_map(self, io: Pipeline, tm: TensorMap) -> TensorMap:
        """The tensor map a spec-decode draft binds for its catch-up (``draft_accept``), given its map ``tm``
        (frozen, the engine state bound): ``tm`` itself where the catch-up reads the inputs its other steps
        read."""
        return tm

    def __repr__(self) -> str:
        return f"<{self.name} contract>"


class StepInputs(abc.ABC):
    """How a setup stages each step's inputs on one contract, and the device work a step enqueues with
    its engine (in its graph). One per setup; it keeps per-shape work in :class:`~trtio._cache.BoundedCache` s.

    Every method is called after the step's inputs were checked and before its engine is enqueued; it
    writes into the PipelineIO's step block (one upload per step) or its staging pairs on ``stream``."""

    def __init__(self, io: Pipeline, rope_table: Callable[[LLMEngineConfig, Stream], Tensor]) -> None:
        step = io.step
        if step is None:
            raise TrtioError(f"{type(self).__name__}: the PipelineIO has no step block")
        self.io = io
        self.step: StepStaging = step
        self._rope_table = rope_table
        self._row_copies: BoundedCache[tuple[int, ...], RowCopy] = BoundedCache()
        self._rope_sources: dict[str, tuple[Tensor, bool]] = {}
        self._decode_works: BoundedCache[tuple[str, int], tuple[DeviceWork, ...]] = BoundedCache()
        self._tree_works: BoundedCache[tuple[Any, ...], tuple[DeviceWork, ...]] = BoundedCache()
        self._level_works: BoundedCache[tuple[Any, ...], tuple[DeviceWork, ...]] = BoundedCache()
        self._targets: dict[str, TreeTargets] = {}
        # Per (role, id of a tree layout): the layout and what a tree step of it writes and runs.
        self._tree_plans: BoundedCache[tuple[str, int], Any] = BoundedCache()
        self._slot_ids: tuple[np.ndarray | None, np.ndarray] = (None, np.zeros(0, np.int32))
        # Per catch-up laid out on the device (role, where the paths lie, their width, the verify's rows per
        # sequence, batch, width, scratch rows): the paths' tensor (kept: its id keys nothing stale) and the work.
        self._catch_up_works: BoundedCache[tuple[Any, ...], tuple[Tensor, tuple[DeviceWork, ...]]] = BoundedCache()

    # -- what every contract shares ----------------------------------------------------------------
    def row_copy(self, dst: Tensor, src: Tensor, src_rows: Tensor, count: int, row_bytes: int,
                 dst_rows: Tensor | None = None) -> RowCopy:
        """The RowCopy of these arguments, one object per distinct copy (an executor compares the work
        before its engine with the work its graph holds: the same object compares at once)."""
        key = (id(dst), id(src), id(src_rows), count, row_bytes, id(dst_rows))
        found = self._row_copies.get(key)
        if found is None:
            found = self._row_copies.put(key, RowCopy(dst, src, src_rows, count, row_bytes, dst_rows))
        return found

    def slot_ids(self, batch: int, slots: np.ndarray | None) -> np.ndarray:
        """A step's slots as the int32 constant the step block takes (``0 .. batch - 1`` without ``slots``); the
        same object while the slots are the same array (a setup's active order is one array until it changes)."""
        if slots is None:
            return ramp(batch)
        last, ids = self._slot_ids
        if slots is not last:
            ids = constant(slots.astype(np.int32))
            self._slot_ids = (slots, ids)
        return ids

    def rope_source(self, e: EngineView, s: Stream) -> tuple[Tensor, bool]:
        """The table a step's RoPE rows are gathered from, and whether it has one per slot (looked up once
        per engine: the tables live as long as the setup)."""
        found = self._rope_sources.get(e.role)
        if found is None:
            found = self._rope_sources[e.role] = \
                (self.io.mrope_cos_sin, True) if e.cfg.rope_per_slot else (self._rope_table(e.cfg, s), False)
        return found

    def write_pages(self, e: EngineView, pages: np.ndarray | None) -> None:
        """Stage a step's page-table rows (a read-only array per rows version: the step block keeps it while
        they stay the same)."""
        if pages is not None:
            self.step.write(PAGE_TABLE_NAMES[e.role == "draft"], pages)

    def decode(self, e: EngineView, lengths: np.ndarray, s: Stream, slots: np.ndarray | None = None,
               key: tuple[int, ...] | None = None, pages: np.ndarray | None = None, *,
               staged: bool = False) -> tuple[DeviceWork, ...]:
        """A decode step's device work: its inputs made on the device from the device's copy of the lengths
        (:class:`~trtio._ops.DecodeAdvance`).

        The copy and the step's constant inputs are uploaded unless ``staged``: the step block holds them already
        (the setup's last decode plan says so: :meth:`DecodePlan.block_holds
        <trtio._setups.decode_plan.DecodePlan.block_holds>`) and nothing written waits for an upload. A steady decode
        runs its plan instead, uploading nothing and replaying its graph as it is."""
        step = self.step
        b = lengths.shape[0]
        self.write_pages(e, pages)
        if not staged or step.pending:
            step.write("decode_lengths", lengths)
            self._write_decode(lengths, slots)
            step.upload(s)
            self._decode_uploaded()
        work = self._decode_works.get((e.role, b))
        if work is None:
            work = self._decode_works.put((e.role, b), self._decode_work(e, b, s))
        return work

    # -- what each contract does its own way -----------------------------------------------------------
    @abc.abstractmethod
    def prompt(self, e: EngineView, past: np.ndarray | None, lengths: np.ndarray, width: int, s: Stream,
               slots: np.ndarray | None = None, pages: np.ndarray | None = None) -> tuple[DeviceWork, ...]:
        """Stage a prefill of ``lengths[i]`` new tokens per sequence (entry-padded to ``width``) after
        ``past[i]`` cached ones (None: empty caches); returns the device work to run before the engine."""

    @abc.abstractmethod
    def empty_prefill(self, e: EngineView, past: np.ndarray | None) -> bool:
        """Whether a prefill's dims say the caches start empty (the shapes that tells the engine)."""

    @abc.abstractmethod
    def _write_decode(self, lengths: np.ndarray, slots: np.ndarray | None) -> None:
        """Write a decode step's constant inputs into the step block (the lengths are written already)."""

    @abc.abstractmethod
    def _decode_uploaded(self) -> None:
        """Called after a decode's upload: what the device now writes itself is stale on the host."""

    @abc.abstractmethod
    def _decode_work(self, e: EngineView, b: int, s: Stream) -> tuple[DeviceWork, ...]:
        """A decode step's device work for ``b`` sequences (:class:`~trtio._ops.DecodeAdvance` and what reads
        its results)."""

    def laid_out(self, e: EngineView, layout: Any, s: Stream, pages: np.ndarray | None = None
                 ) -> tuple[DeviceWork, ...]:
        """Stage a step whose every input a family lays out itself (a token-major ``StepLayout``; ``pages``: its
        page-table rows); returns its device work (the RoPE rows gathered at its positions). A contract without
        token-major steps refuses."""
        raise TrtioError(f"{type(self).__name__}: a step laid out by its family is staged on the ragged contract only")

    @abc.abstractmethod
    def tree(self, e: EngineView, layout: TreeLayout, past: np.ndarray, select: np.ndarray, s: Stream,
             slots: np.ndarray | None = None, pages: np.ndarray | None = None) -> tuple[DeviceWork, ...]:
        """Stage a tree step (verify, catch-up) of ``layout`` after ``past`` cached tokens; returns its
        device work. ``select`` is the batch contract's token selection ([B, N] or [B, 1])."""

    @abc.abstractmethod
    def draft_buffers(self, e: EngineView, words: Tensor, nodes: Tensor, width: int,
                      n_words: int) -> DraftTreeBuffers:
        """Where the draft tree lives on the device and the step inputs its levels write."""

    @abc.abstractmethod
    def draft_level(self, e: EngineView, tree: DraftTreeBuffers, plan: DraftLevelPlan,
                    s: Stream) -> tuple[DeviceWork, ...]:
        """Stage a proposal level (its parents; the round's lengths on its first level, unless the device has them:
        ``plan.caught_up``) and return its device work: the level made on the device, then what reads it (RoPE
        rows)."""

    #: The step-block name of a round's cached lengths: what its levels and tree steps read.
    round_past: ClassVar[str]

    def round_placed(self, past: np.ndarray) -> None:
        """A round's first level that read its lengths on the device (``DraftLevelPlan.caught_up``) was enqueued:
        once it has run, the step block holds ``past`` (an int32 constant) as the round's lengths, which the
        round's verify and catch-up then stage at no cost."""
        self.step.device_wrote(self.round_past, past)

    @abc.abstractmethod
    def stage_round(self, e: EngineView, plan: DraftLevelPlan, width: int, s: Stream) -> None:
        """Stage a round's first proposal level (``plan.n0 == 0``) without its device work: the round's inputs
        (its cached lengths and root rows, and what the contract's levels read besides: offsets, slots, page-table
        rows), the level's parents, one upload; then the block forgets the constants it held in what the levels
        write on the device. :meth:`draft_level` stages a first level with this; a round whose first level's
        device work is known (the same batch, nodes, parents and embeddings source as a level it staged) stages
        this alone. ``width``: the round's nodes per sequence."""

    def stage_parents(self, n0: int, batch: int, parents: np.ndarray, s: Stream) -> None:
        """Stage a proposal level's ``parents`` (:meth:`draft_level`'s place for them: each level a slot of its
        own, from element ``n0 * batch``) and upload what is written. A round's later level whose device work is
        known (the same place, parents and previous level as a level :meth:`draft_level` staged) stages this
        alone."""
        step = self.step
        step.write_at("draft_parents", n0 * batch, parents)
        step.upload(s)

    @abc.abstractmethod
    def prompt_roots(self, batch: int, width: int, lengths: np.ndarray) -> np.ndarray:
        """Each sequence's root hidden row after a draft prefill of ``lengths`` in ``width``-wide rows."""

    @abc.abstractmethod
    def catch_up_roots(self, batch: int, width: int, accepted: np.ndarray) -> np.ndarray | None:
        """Each sequence's root hidden row after a catch-up over ``accepted`` tokens (None: the rows a
        round's first level reads by default)."""

    #: Whether a catch-up's logits rows count every row of its sequences (``b * width + n - 1``: the ragged
    #: contract's) or each sequence's own (``n - 1``: the batch contract's token selection).
    catch_up_logits_per_row: ClassVar[bool]

    @abc.abstractmethod
    def catch_up_targets(self, e: EngineView) -> CatchUpTargets:
        """Where a catch-up's layout made on the device (:class:`~trtio._ops.CatchUpLayout`) writes its inputs."""

    def catch_up(self, e: EngineView, moves: Tensor, stride: int, nodes: int, batch: int, width: int, scratch: int,
                 past: np.ndarray, s: Stream, slots: np.ndarray | None = None,
                 pages: np.ndarray | None = None) -> tuple[DeviceWork, ...]:
        """Stage a catch-up of ``batch`` sequences in ``width``-wide rows that the device lays out from the paths
        accept() left at ``moves`` (``stride`` ints a row, nodes of a verify step ``nodes`` rows per sequence; their
        rows gathered into ``scratch`` rows per sequence): its cached lengths (and what the contract's tree step
        reads besides: slots, page-table rows, the constant offsets) in one upload where the block lacks them, and
        nothing of its layout. Returns its device work: the layout and its tree step in one kernel
        (:class:`~trtio._ops.CatchUpLayout`), then what reads them (RoPE rows); the same object while the catch-up
        keeps its shape, whatever was accepted."""
        self._stage_catch_up(e, batch, width, past, s, slots, pages)
        key = (e.role, id(moves), stride, nodes, batch, width, scratch)
        found = self._catch_up_works.get(key)
        if found is None or found[0] is not moves:
            words = max(1, -(-width // 32))
            chain = self._chain_work(e, batch, width, words, s)
            tree = chain[0]
            assert isinstance(tree, TreeStep)
            layout = CatchUpLayout(self.catch_up_targets(e), moves, stride, nodes, batch, width, scratch, words=words,
                                   logits_stride=width if self.catch_up_logits_per_row else 0, roots_stride=width,
                                   tree=tree)
            found = self._catch_up_works.put(key, (moves, (layout, *chain[1:])))
        return found[1]

    @abc.abstractmethod
    def _stage_catch_up(self, e: EngineView, batch: int, width: int, past: np.ndarray, s: Stream,
                        slots: np.ndarray | None, pages: np.ndarray | None) -> None:
        """:meth:`catch_up`'s staging: its step values written and uploaded (where any is new), and what the layout
        writes on the device forgotten by the block."""

    @abc.abstractmethod
    def _chain_work(self, e: EngineView, b: int, width: int, words: int, s: Stream) -> tuple[DeviceWork, ...]:
        """The tree step of a catch-up's causal chains (``b`` sequences of ``width`` rows, ``words`` mask ints a
        row), and what reads it (RoPE rows): :meth:`tree`'s work for such a layout."""

    def catch_up_roots_held(self, roots: np.ndarray) -> np.ndarray | None:
        """After a catch-up laid out on the device has run: each sequence's root row (``roots``, the contract's
        :meth:`catch_up_roots`) as the constant the step block then holds where the layout wrote them there (a
        round's first level stages that constant at no cost); None where it writes none."""
        return None

    @abc.abstractmethod
    def tree_targets(self, e: EngineView) -> TreeTargets:
        """What a tree step of the engine ``role`` reads and writes on the device."""

    def tree_starts(self) -> Tensor | None:
        """Where a verify step leaves each sequence's cached length on the device ([batch] int32, the sequences'
        order) until the next step, for accept's KV commit to read; None where it leaves none (the commit's rows
        then carry the starts)."""
        return None


# The step-block name of a step's page-table rows, by whether the engine is the draft (StepInputs.write_pages).
PAGE_TABLE_NAMES = ("kv_page_table", "draft_kv_page_table")
# A spec-decode step block's draft lengths after its last tree step (a catch-up: past + accepted), written by the
# device alone (ops.TreeTargets.next), read by the next round's first level (ops.DraftLevel.past_from). Last in the
# block: no upload's byte range reaches it.
ROUND_NEXT = "round_next"


def rope_row_bytes(cfg: LLMEngineConfig) -> int:
    """Bytes of one RoPE cos/sin row (float32)."""
    return cfg.rotary_dim * DType.FLOAT32.itemsize


def seed_requests(b: int, seq: int, h: int, act: DType, *, logits_rows: int, vocab: int,
                  select_cols: int) -> list[TensorRequest]:
    """The seed's batch-major members (embeddings, logits, selection, context lengths and their twins)."""
    return [
        TensorRequest.of("inputs_embeds", (b, seq, h), act),
        TensorRequest.of("output_logits", (logits_rows, vocab), DType.FLOAT32),
        TensorRequest.of("select_token_indices", (b, select_cols), DType.INT64),
        TensorRequest.of("context_lengths", (b,), DType.INT32),
        TensorRequest.of("host_context_lengths", (b,), DType.INT32, Location.PINNED),
        TensorRequest.of("host_select_token_indices", (b, 1), DType.INT64, Location.PINNED),
    ]


#: The seed's staged members: (pinned twin, device member), each staged through a private ring.
SEED_STAGING_PAIRS = (("host_context_lengths", "context_lengths"),
                      ("host_select_token_indices", "select_token_indices"))


def deepstack_requests(n: int, shape: Sequence[int], zero_shape: Sequence[int], act: DType) -> list[TensorRequest]:
    """The deepstack feature buffers and Edge-LLM's zero buffer they are bound to without features."""
    if n == 0:
        return [absent("deepstack_zero", act)]
    reqs = [TensorRequest.of(names.deepstack_embeds(i), tuple(shape), act) for i in range(n)]
    reqs.append(TensorRequest.of("deepstack_zero", tuple(zero_shape), act))
    return reqs


def mrope_request(cfg: LLMEngineConfig, b: int) -> TensorRequest:
    """MRoPE's per-slot cos/sin tables [B, C, R] (empty without MRoPE)."""
    if not cfg.rope_per_slot:
        return absent("mrope_cos_sin", DType.FLOAT32)
    return TensorRequest.of("mrope_cos_sin", (b, cfg.max_kv_cache_capacity, cfg.rotary_dim), DType.FLOAT32)

