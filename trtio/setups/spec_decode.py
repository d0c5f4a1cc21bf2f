"""create_for_spec_decode: an EAGLE-style base + draft pair sharing one PipelineIO, and its step protocol.

The two engines share one PipelineIO and one context memory, each with its own tensor map and KV
state: base prefill, draft prefill, draft proposal, base verify over a token tree, accept (KV
compaction along the accepted path) and the draft's catch-up over the accepted tokens (Edge-LLM's
``eagleDecoder`` phases, notes §9).

Returned logits are views of PipelineIO buffers, written on the step's stream and valid until the
next step overwrites them. Steps never allocate; decode-type steps never synchronise the host.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from trtio.config import DeploymentConfig
from trtio.cuda.backend import Backend, Location
from trtio.engine import DECODE_PROFILE, ContextMemory, GraphStats
from trtio.errors import ShapeError, TrtioError
from trtio.memory import Arena, HostStaging, MemoryReport, TensorRequest
from trtio.pipeline_io import PipelineIO
from trtio.setups.base import BoundEngine, SetupBase, _fill_mrope, _RopeTables, bind_engine, engine_backend
from trtio.spec_decode import ancestor_mask, pack_tree_mask, tree_position_ids
from trtio.stream import Stream, StreamLike, as_stream
from trtio.tensor import Tensor

__all__ = ["SpecDecodeSetup", "create_for_spec_decode"]


class SpecDecodeSetup(SetupBase):
    """A spec-decode base + draft sharing one PipelineIO (see module docstring).

    Lengths: ``base_lengths`` counts tokens the base has cached and committed; the draft's cache is
    committed up to the same length (its proposal entries past it are scratch, rewritten by
    :meth:`draft_accept`).
    """

    def __init__(self, base_engine: Any, draft_engine: Any, bundle: DeploymentConfig,
                 max_runtime_batch_size: int | None = None, stream: StreamLike = None, *, graphs: bool = False,
                 backend: Backend | str | None = None) -> None:
        bundle.validate()
        if bundle.draft is None or bundle.spec is None:
            raise TrtioError("create_for_spec_decode needs a DeploymentConfig with a draft and a spec section")
        be = engine_backend(base_engine, backend)
        self._backend = be
        self.bundle = bundle
        base_cfg, draft_cfg = bundle.base, bundle.draft
        with self._building() as stack:
            self._default_stream = s = as_stream(stream, be)  # None: trtio's default stream of the backend
            self.io = io = stack.enter_context(
                PipelineIO.create_for_spec_decode(bundle, max_runtime_batch_size, s, backend=be))
            mb = io.max_batch
            self._rope = stack.enter_context(_RopeTables(be))
            self._context_memory = stack.enter_context(ContextMemory.for_engines([base_engine, draft_engine],
                                                                                 backend=be))
            self.base = bind_engine(base_engine, base_cfg, io.build_tensor_map(base_cfg), max_batch=mb, backend=be,
                                    context_memory=self._context_memory, graphs=graphs, rope=self._rope, stream=s,
                                    resources=stack, name="base")
            self.draft = bind_engine(draft_engine, draft_cfg, io.build_tensor_map_for_spec_decode_draft(draft_cfg),
                                     max_batch=mb, backend=be, context_memory=self._context_memory, graphs=graphs,
                                     rope=self._rope, stream=s, resources=stack, name="draft")
            step = max(bundle.effective_max_draft_proposal_size(), 1)
            self._extra_arena = stack.enter_context(Arena([
                TensorRequest.of("host_inputs_embeds", (mb, step, base_cfg.hidden_size), base_cfg.activation,
                                 Location.PINNED)], backend=be, title="spec_decode staging"))
            self._embeds_staging = stack.enter_context(
                HostStaging(self._extra_arena["host_inputs_embeds"], io.inputs_embeds, be))
            _fill_mrope(io, base_cfg, s)
        self._batch: int | None = None
        # Row of draft_hidden_states_out holding each sequence's latest draft hidden state.
        self._draft_last_row = np.zeros(mb, np.int64)
        self._draft_lengths = np.zeros(mb, np.int64)  # draft cache entries incl. proposal scratch
        self._verify_nodes: int | None = None

    def engines(self) -> list[BoundEngine]:
        return [self.base, self.draft]

    # -- public views ---------------------------------------------------------------------------
    @property
    def base_lengths(self) -> np.ndarray:
        b = self._batch or 0
        return self.base.state.lengths[:b].copy()

    @property
    def graph_stats(self) -> dict[str, GraphStats]:
        return {"base": self.base.executor.graph_stats, "draft": self.draft.executor.graph_stats}

    @property
    def batch(self) -> int | None:
        return self._batch

    def _need_batch(self) -> int:
        if self._batch is None:
            raise TrtioError("run base_prefill() first: there is no sequence to continue")
        return self._batch

    # -- phases ---------------------------------------------------------------------------------
    def base_prefill(self, inputs_embeds: Any, context_lengths: Any, stream: StreamLike = None, *,
                     deepstack_embeds: Sequence[Any] | None = None) -> Tensor:
        """Base over the prompts (profile 0, causal mask [B,1,1]); returns logits [batch, vocab].

        The base's ``hidden_states`` land in ``io.base_hidden_states`` [batch, seq, ...], which the draft
        prefill reads as ``hidden_states_input`` at the same address. Without ``deepstack_embeds`` the
        deepstack inputs are zero.
        """
        self._check_open()
        e = self.base
        s = self._stream(stream)
        b, seq, ctx = self._stage_prompt(e, inputs_embeds, context_lengths, s)
        self._bind_deepstack(e, deepstack_embeds, b, seq, s)
        self._run_prefill(e, b, seq, ctx, s)
        self._batch = b
        return self.io.output_logits

    def draft_prefill(self, inputs_embeds: Any, context_lengths: Any, stream: StreamLike = None) -> Tensor:
        """Draft over the prompts shifted by one token (EAGLE): row p holds the embedding of token p+1,
        ``hidden_states_input`` is the base prefill's hidden states (no copy), ``hidden_states_from_draft``
        is zero. Returns the draft logits [batch, draft vocab] at each sequence's last row."""
        self._check_open()
        b0 = self._need_batch()
        e = self.draft
        s = self._stream(stream)
        b, seq, ctx = self._stage_prompt(e, inputs_embeds, context_lengths, s)
        if b != b0:
            raise ShapeError(f"inputs_embeds: batch {b} differs from the base prefill's batch {b0}")
        self.io.base_hidden_states.reshape((b, seq, e.cfg.base_model_hidden_size))
        self.io.draft_hidden_states_in.reshape((b, seq, e.cfg.hidden_size)).zero_(s)
        self._run_prefill(e, b, seq, ctx, s)
        self._draft_lengths[:b] = ctx
        self._draft_last_row[:b] = ctx - 1
        return self.io.output_logits

    def _carry_draft_hidden(self, b: int, s: Stream) -> None:
        """Copy each sequence's latest draft hidden row into row 0 of ``draft_hidden_states_in``."""
        out, dst = self.io.draft_hidden_states_out, self.io.draft_hidden_states_in
        h = self.draft.cfg.hidden_size
        row = h * out.dtype.itemsize
        out_seq = out.shape[1] if len(out.shape) == 3 else 1
        rows = self._draft_last_row[:b]
        be = self._backend
        if (rows == 0).all() and out_seq == 1:
            be.memcpy(dst.data_ptr, out.data_ptr, b * row, s.handle)
        else:
            for i in range(b):
                be.memcpy(dst.data_ptr + i * row, out.data_ptr + (i * out_seq + int(rows[i])) * row, row, s.handle)

    def draft_propose(self, inputs_embeds: Any, stream: StreamLike = None) -> Tensor:
        """One chain proposal step of the draft: one token per sequence (its last proposal) after the
        draft's cache, conditioned on the draft's previous hidden state; returns logits [batch, draft vocab].

        Following Edge-LLM, ``hidden_states_input`` (the base's hidden states) is zero here.
        """
        self._check_open()
        b = self._need_batch()
        e = self.draft
        s = self._stream(stream)
        nb, ns = self._stage_embeds(inputs_embeds, self._embeds_staging, "inputs_embeds", e.cfg.hidden_size, s)
        if (nb, ns) != (b, 1):
            raise ShapeError(f"inputs_embeds: a proposal step takes [batch={b}, 1, hidden], got [{nb}, {ns}, ...]")
        lengths = self._draft_lengths[:b]
        if int(lengths.max()) >= e.cfg.max_kv_cache_capacity:
            raise ShapeError("draft KV cache full")
        self._carry_draft_hidden(b, s)
        self.io.draft_hidden_states_in.reshape((b, 1, e.cfg.hidden_size))
        self.io.base_hidden_states.reshape((b, 1, e.cfg.base_model_hidden_size)).zero_(s)
        e.state.upload_start_index(lengths, s)  # a one-token step: the mask is the [B,1,1] causal sentinel
        self.io.upload_context_lengths(lengths + 1, s)
        self.io.upload_select_token_indices(np.zeros((b, 1), np.int64), s)
        dims = e.cfg.proposal_dims(b, 1, 1)
        e.executor.prepare(DECODE_PROFILE, e.tensor_map, dims, s)
        e.executor.execute(s)
        lengths += 1
        self._draft_last_row[:b] = 0
        return self.io.output_logits

    def verify(self, inputs_embeds: Any, tree: Any, stream: StreamLike = None) -> Tensor:
        """Base over a token tree per sequence; returns logits [batch * N, vocab] for every node.

        ``tree`` is a parent list (shared by the batch; -1 for the root) or an unpacked mask [B, N, N]
        (node t sees node i). Nodes go to cache slots ``length + t``; positions are length + depth.
        The base cache is not committed until :meth:`accept`.
        """
        self._check_open()
        b = self._need_batch()
        e = self.base
        s = self._stream(stream)
        mask = np.asarray(tree)
        if mask.ndim == 1:
            mask = np.broadcast_to(ancestor_mask(mask), (b,) + (mask.shape[0],) * 2)
        if mask.ndim != 3 or mask.shape[0] != b:
            raise ShapeError(f"tree: expected a parent list or a [batch={b}, N, N] mask, got shape {mask.shape}")
        n = mask.shape[1]
        nb, ns = self._stage_embeds(inputs_embeds, self._embeds_staging, "inputs_embeds", e.cfg.hidden_size, s)
        if (nb, ns) != (b, n):
            raise ShapeError(f"inputs_embeds: verify of {n} nodes takes [batch={b}, {n}, hidden], "
                             f"got [{nb}, {ns}, ...]")
        lengths = e.state.lengths[:b]
        if int(lengths.max()) + n > e.cfg.max_kv_cache_capacity:
            raise ShapeError(f"verify: {n} nodes do not fit after {int(lengths.max())} cached tokens "
                             f"(max_kv_cache_capacity {e.cfg.max_kv_cache_capacity})")
        self.io.upload_tree(pack_tree_mask(mask), tree_position_ids(mask, lengths), s)
        e.state.upload_start_index(lengths, s)
        self.io.upload_context_lengths(lengths + n, s)
        self.io.upload_select_token_indices(np.broadcast_to(np.arange(n, dtype=np.int64), (b, n)), s)
        e.tensor_map.use_deepstack_zero()
        dims = e.cfg.spec_verify_dims(b, n)
        e.executor.prepare(DECODE_PROFILE, e.tensor_map, dims, s)
        e.executor.execute(s)
        self._verify_nodes = n
        return self.io.output_logits

    def accept(self, paths: Sequence[Sequence[int]], stream: StreamLike = None) -> None:
        """Commit each sequence's accepted root-to-node path of the last verify tree.

        The path's nodes are compacted in the base KV cache to consecutive slots after the committed
        length, their base hidden-state rows to rows 0.. of ``base_hidden_states`` (what
        :meth:`draft_accept` reads), and the base lengths grow by the path length.
        """
        self._check_open()
        b = self._need_batch()
        n = self._verify_nodes
        if n is None:
            raise TrtioError("accept() before verify()")
        if len(paths) != b:
            raise ShapeError(f"paths: expected one path per sequence ({b}), got {len(paths)}")
        s = self._stream(stream)
        be = self._backend
        lengths = self.base.state.lengths
        hidden = self.io.base_hidden_states
        hrow = hidden.shape[2] * hidden.dtype.itemsize
        for i, path in enumerate(paths):
            path = [int(p) for p in path]
            if not path or path[0] != 0 or any(p < 0 or p >= n for p in path) or sorted(set(path)) != path:
                raise ShapeError(f"paths[{i}] = {path}: expected increasing node indices in 0..{n - 1} "
                                 f"starting at the root 0")
            start = int(lengths[i])
            self.base.state.commit_path(i, start, path, s)
            for j, node in enumerate(path):
                if node != j:
                    be.memcpy(hidden.data_ptr + (i * n + j) * hrow, hidden.data_ptr + (i * n + node) * hrow, hrow,
                              s.handle)
            lengths[i] = start + len(path)
        self._verify_nodes = None

    def draft_accept(self, inputs_embeds: Any, accept_lengths: Any, stream: StreamLike = None) -> Tensor:
        """The draft's catch-up over the accepted tokens (shifted by one, as in the prefill): row t of
        sequence b holds the embedding of the token after accepted node t; ``hidden_states_input`` rows are
        the accepted nodes' base hidden states (compacted by :meth:`accept`). Starts at the draft's
        committed length; returns draft logits [batch, draft vocab] at each sequence's last accepted row."""
        self._check_open()
        b = self._need_batch()
        e = self.draft
        s = self._stream(stream)
        nb, a = self._stage_embeds(inputs_embeds, self._embeds_staging, "inputs_embeds", e.cfg.hidden_size, s)
        if nb != b:
            raise ShapeError(f"inputs_embeds: batch {nb} differs from {b}")
        acc = self._check_lengths(accept_lengths, b, a, "accept_lengths")
        start = self.base.state.lengths[:b] - acc  # the draft is committed up to the base's previous length
        if (start < 0).any():
            raise ShapeError("accept_lengths exceed the committed base lengths; call accept() first")
        hb = e.cfg.base_model_hidden_size
        n = self.io.base_hidden_states.shape[1] if len(self.io.base_hidden_states.shape) == 3 else a
        if n != a:
            self._compact_rows(self.io.base_hidden_states, b, n, a, hb, s)
        self.io.base_hidden_states.reshape((b, a, hb))
        self.io.draft_hidden_states_in.reshape((b, a, e.cfg.hidden_size)).zero_(s)
        causal = np.stack([np.tril(np.ones((a, a), bool)) & (np.arange(a)[None, :] < k) & (np.arange(a)[:, None] < k)
                           for k in acc])
        pos = np.where(np.arange(a)[None, :] < acc[:, None], start[:, None] + np.arange(a)[None, :], 0)
        self.io.upload_tree(pack_tree_mask(causal), pos.astype(np.int32), s)
        e.state.upload_start_index(start, s)
        self.io.upload_context_lengths(start + a, s)
        self.io.upload_select_token_indices((acc - 1)[:, None], s)
        dims = e.cfg.accept_dims(b, a)
        e.executor.prepare(DECODE_PROFILE, e.tensor_map, dims, s)
        e.executor.execute(s)
        e.state.lengths[:b] = start + acc
        self._draft_lengths[:b] = start + acc
        self._draft_last_row[:b] = acc - 1
        return self.io.output_logits

    def _compact_rows(self, t: Tensor, b: int, n: int, a: int, width: int, s: Stream) -> None:
        """Re-lay rows [b, :a] of a [b, n, width] view as a [b, a, width] view, in place.

        Row by row in increasing order: each destination row precedes its source row, so no copy
        overwrites a row a later copy still reads, and no single copy overlaps itself.
        """
        row = width * t.dtype.itemsize
        for i in range(1, b):
            for r in range(a):
                self._backend.memcpy(t.data_ptr + (i * a + r) * row, t.data_ptr + (i * n + r) * row, row, s.handle)

    def reset(self, stream: StreamLike = None) -> None:
        self._check_open()
        self.base.state.reset(stream)
        self.draft.state.reset(stream)
        self._draft_lengths[:] = 0
        self._batch = None

    def memory_report(self, *, include_context_memory: bool = True) -> MemoryReport:
        """Every buffer the setup owns: the shared PipelineIO, both KV states, staging, RoPE tables and
        the shared context memory."""
        return self._report("create_for_spec_decode", include_context_memory)

    def __repr__(self) -> str:
        return f"SpecDecodeSetup(batch={self._batch})"


def create_for_spec_decode(base_engine: Any, draft_engine: Any, bundle: DeploymentConfig,
                           max_runtime_batch_size: int | None = None, stream: StreamLike = None, *,
                           graphs: bool = False, backend: Backend | str | None = None) -> SpecDecodeSetup:
    """Bind a base + draft pair to one shared PipelineIO (see :class:`SpecDecodeSetup`)."""
    return SpecDecodeSetup(base_engine, draft_engine, bundle, max_runtime_batch_size, stream, graphs=graphs,
                           backend=backend)
