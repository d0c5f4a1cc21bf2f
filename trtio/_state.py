"""Engine state: the inputs an engine updates in place (KV caches and alike), and their bookkeeping.

The state owns its bindings' specs. It derives them from the engine's declared I/O (rank, fixed
dims, profile max) and checks them against the config; the executor takes every state binding's
shape from here, so no registry repeats it. Two KV layouts exist, one per engine I/O contract:

* ``"contiguous"`` — ``k_cache_i`` / ``v_cache_i`` ``[B, Hkv, C, D]`` (TensorRT's KVCacheUpdate layer),
  aliased by ``present_k_cache_i`` / ``present_v_cache_i``, plus ``kvcache_start_index``. Allocated at
  the profile-max shape and bound at it, except a dynamic leading batch dimension, which follows the
  step's batch (KVCacheUpdate wants cache batch = update batch; the row-major layout keeps each slot's
  address); a fixed batch dimension stays fixed.
* ``"paged"`` — one pool per layer ``past_key_values_i`` ``[2, P, page, Hkv, D]`` (K pages then V pages)
  aliased by ``present_key_values_i``, plus ``kv_page_table`` ``[S, 2, M]``: row 0 holds a sequence's K
  page ids, row 1 its V ids (K id + P). Sequence slot ``b`` owns pages ``b*M .. b*M + M - 1``.

A hybrid model's recurrent states (``conv_state_j`` / ``recurrent_state_j``, aliased by their ``present_*``) are
pools of one row per sequence slot (:mod:`trtio.families.hybrid.recurrent`), bound at their full row count whatever
the step's batch: ``state_indices`` picks each sequence's row. ``lengths`` is the host mirror of the tokens each
sequence slot has committed.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from trtio import names
from trtio._config import LLMEngineConfig
from trtio._cuda.backend import Backend, Location, get_backend
from trtio._dtypes import DType
from trtio._edgellm_config import KV_PAGE_SIZE
from trtio._engine import EngineIO
from trtio._lifetime import Closeable, open_binders
from trtio._memory import Arena, MemoryReport, TensorRequest
from trtio._ops import KVCommit, KVLayout
from trtio._registry import Dim, ProfileShapes, TensorSpec
from trtio._staging import INPUT_RING_SLOTS, StepStaging, UploadRing
from trtio._stream import Stream, StreamLike, as_stream
from trtio._tensor import Tensor
from trtio._tensor_map import TensorMap
from trtio.errors import BindingError, ClosedError, EngineError, FrozenError, ShapeError
from trtio.features import KVPools, family_configs

MAX_PATH_MOVES = 32  # Edge-LLM commits accepted paths of depth <= 32

__all__ = ["MAX_PATH_MOVES", "EngineState", "kv_layout", "paged_state_specs", "path_grid", "state_names",
           "state_problems"]


def _fmt(shape: Sequence[int]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _layer_of(name: str, template: str) -> int | None:
    head = template + "_"
    if name.startswith(head) and name[len(head):].isdigit():
        return int(name[len(head):])
    return None


def path_grid(paths: Sequence[Sequence[int]] | np.ndarray, batch: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Node paths, one per sequence (lists of ints, or an int array [batch, L] padded with trailing -1), as
    an int64 grid [batch, longest] padded with -1 and each path's length. Raises ShapeError for another
    count than ``batch``, non-integer nodes, an empty path or padding before a node."""
    rect = _rectangular(paths) if type(paths) is list else None  # equal lengths, all ints: numpy reads them
    if isinstance(paths, np.ndarray):
        if paths.ndim != 2 or paths.dtype.kind not in "iu":
            raise ShapeError(f"paths: expected an integer array [batch, nodes], got {paths.dtype} {paths.shape}")
        grid = paths.astype(np.int64)
        real = grid >= 0
        lens = real.sum(axis=1)
        bad = (lens < 1) | (real != (np.arange(grid.shape[1]) < lens[:, None])).any(axis=1)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ShapeError(f"paths[{i}] = {grid[i].tolist()}: a path is at least one node, its -1 padding last")
    elif rect is not None:
        grid = rect
        lens = np.full(grid.shape[0], grid.shape[1], np.int64)
    else:
        if isinstance(paths, (str, bytes)) or not hasattr(paths, "__len__"):  # type: ignore[unreachable]  # untyped callers
            raise ShapeError(f"paths: expected one path (a list of node indices) per sequence, got "
                             f"{type(paths).__name__}")
        if batch is not None and len(paths) != batch:
            raise ShapeError(f"paths: expected one path per sequence ({batch}), got {len(paths)}")
        # Lists of plain ints (what a runtime builds) pass as they are; anything else is checked node by node.
        rows = [p if type(p) is list and set(map(type, p)) <= _INT_TYPES else _path_nodes(p, i)
                for i, p in enumerate(paths)]
        lens = np.fromiter(map(len, rows), np.int64, len(rows))
        if lens.size and lens.min() < 1:
            raise ShapeError(f"paths[{int(np.argmin(lens))}] is empty: a path is at least its root")
        grid = np.full((lens.size, int(lens.max(initial=0))), -1, np.int64)
        grid[np.arange(grid.shape[1]) < lens[:, None]] = [v for r in rows for v in r]
    if batch is not None and grid.shape[0] != batch:
        raise ShapeError(f"paths: expected one path per sequence ({batch}), got {grid.shape[0]}")
    return grid, lens


def _rectangular(paths: list[Any]) -> np.ndarray | None:
    """Paths of equal lengths, all ints, as an int64 grid; None for anything else (the general path checks
    and reports it)."""
    try:
        if not {type(v) for p in paths for v in p} <= _INT_TYPES:  # bools are refused, not read as 0 and 1
            return None
        grid = np.array(paths)
    except (ValueError, TypeError, OverflowError):
        return None
    if grid.ndim != 2 or grid.dtype.kind not in "iu" or grid.shape[1] < 1:
        return None
    return grid.astype(np.int64, copy=False)


_INT_TYPES = {int, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64}


def _path_nodes(path: Any, i: int) -> list[int]:
    """``paths[i]`` as node indices; anything but ints is refused (``int()`` would take node 1.5 for node 1)."""
    if isinstance(path, (str, bytes)) or not hasattr(path, "__iter__"):
        raise ShapeError(f"paths[{i}]: expected a list of node indices, got {type(path).__name__} {path!r}")
    nodes = []
    for v in path:
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
            raise ShapeError(f"paths[{i}]: node {v!r} is not an int node index ({type(v).__name__})")
        nodes.append(int(v))
    return nodes


def paged_state_specs(cfg: LLMEngineConfig, max_batch: int | None = None) -> list[TensorSpec]:
    """What an engine of the ragged contract declares for its paged KV state (pools, their aliases and
    the page table), with both profiles: pools fixed at ``[2, P, page, Hkv, D]`` (``P`` =
    ``cfg.kv_pool_pages``), the page table ``[1..B, 2, M]``; a family may declare them its own way
    (:meth:`~trtio.features.FamilyConfig.declared_state`). The ReferenceEngine declares these."""
    b = max_batch or cfg.max_supported_batch_size
    lent = {names.present_key_values(int(p.rsplit("_", 1)[1])) for p in borrowed_state(cfg)}  # no output updates them
    for family in cfg.features:
        found = family.declared_state(cfg, b)
        if found is not None:
            return [spec for spec in found if spec.name not in lent]
    m = cfg.pages_per_sequence
    pool = (2, cfg.kv_pool_pages, cfg.kv_page_size, cfg.num_kv_heads, cfg.head_dim)
    fixed: tuple[ProfileShapes, ...] = ((pool, pool, pool),) * 2
    declared = (2, -1, cfg.kv_page_size, cfg.num_kv_heads, cfg.head_dim)
    pools = [(pool, fixed, declared)] * cfg.num_attention_layers
    out = []
    for i, (shape, profiles, decl) in enumerate(pools):
        out.append(TensorSpec(names.past_key_values(i), "input", cfg.kv_dtype, shape, profiles, declared=decl))
    out.append(TensorSpec(names.kKVPageTable, "input", DType.INT32, ("batch", 2, m),
                          (((1, 2, m), (b, 2, m), (b, 2, m)),) * 2, declared=(-1, 2, -1)))
    for i, (shape, _profiles, decl) in enumerate(pools):
        out.append(TensorSpec(names.present_key_values(i), "output", cfg.kv_dtype, shape, declared=decl))
    return out


def _is_kv_cache(name: str) -> bool:
    """Whether the state input ``name`` is a KV cache (paged ``past_key_values_i`` or contiguous ``k_cache_i`` /
    ``v_cache_i``), not a pool of one row per slot."""
    return _layer_of(name, names.kPastKeyValuesTemplate) is not None or names.is_kv_cache_binding(name)


def kv_layout(eio: EngineIO) -> str:
    """``"paged"`` when the engine has a page table or ``past_key_values_i`` pools, else ``"contiguous"``."""
    if names.kKVPageTable in eio:
        return "paged"
    paged = any(_layer_of(p, names.kPastKeyValuesTemplate) is not None for p, _ in eio.state_pairs())
    return "paged" if paged else "contiguous"


def state_names(eio: EngineIO) -> set[str]:
    """Every binding of ``eio`` the engine state owns: both names of each pair, the page table, the start index and
    what it binds for a family (:attr:`~trtio.features.FamilyConfig.STATE_BINDINGS`)."""
    out = {n for pair in eio.state_pairs() for n in pair}
    owned = (names.kKVPageTable, names.kKVCacheStartIndex, *(n for f in family_configs() for n in f.STATE_BINDINGS))
    out |= {n for n in owned if n in eio}
    return out


def state_problems(eio: EngineIO, cfg: LLMEngineConfig | None, max_batch: int, *,
                   pages_on_demand: bool = False) -> list[str]:
    """Every problem of the engine's declared state (and, with ``cfg``, its fit to the config and to
    ``max_batch`` sequences): missing aliases, unbounded shapes, a paged cache without a page table,
    KV dtype and dims that disagree with the config, a page pool too small (a pool whose pages a setup
    hands out on demand, ``pages_on_demand``, may be smaller than every slot's pages)."""
    problems = []
    pairs = eio.state_pairs()
    paired = {p for p, _ in pairs} | borrowed_state(cfg)
    layout = kv_layout(eio)
    for info in eio.inputs:
        for past_t, present_t in names.STATE_PAIRS:
            layer = _layer_of(info.name, past_t)
            if layer is not None and info.name not in paired:
                problems.append(f"{info.name}: the engine declares this state input but no output updates it "
                                f"in place (expected {present_t}_{layer})")
    for past, _present in pairs:
        info = eio[past]
        if any(d < 0 for d in info.max_shape()):
            problems.append(f"{past}: state input has no bounded max shape ({_fmt(info.max_shape())}); its "
                            f"profiles must bound every dimension")
    if layout == "paged" and names.kKVPageTable not in eio:
        problems.append(f"{names.kKVPageTable}: the engine has paged KV caches ({names.kPastKeyValuesTemplate}_i) "
                        f"but declares no page table")
    if layout == "paged" and names.kKVPageTable in eio:
        table = eio[names.kKVPageTable]
        if table.dtype is not DType.INT32 or len(table.shape) != 3 or table.shape[1] not in (2, -1):
            problems.append(f"{names.kKVPageTable}: expected an int32 [sequences, 2, pages] input, the engine "
                            f"declares {table.dtype} {_fmt(table.shape)}")
        elif any(d < 0 for d in table.max_shape()):
            problems.append(f"{names.kKVPageTable}: its profiles do not bound {_fmt(table.max_shape())}")
    if cfg is None or problems:
        return problems
    problems += _config_problems(eio, cfg, max_batch, pages_on_demand)
    for family in cfg.features:  # what each family says of the engine's state (a hybrid's per-slot pools)
        problems += family.engine_problems(eio, cfg, max_batch)
    return problems


def _config_problems(eio: EngineIO, cfg: LLMEngineConfig, max_batch: int, pages_on_demand: bool) -> list[str]:
    problems = []
    pairs_list = eio.state_pairs()
    paged = kv_layout(eio) == "paged"
    expected = ([(names.past_key_values(i), names.present_key_values(i)) for i in range(cfg.num_attention_layers)]
                if paged else
                [pair for i in range(cfg.num_attention_layers)
                 for pair in ((names.k_cache(i), names.present_k_cache(i)),
                              (names.v_cache(i), names.present_v_cache(i)))])
    pairs = dict(pairs_list)
    borrowed = borrowed_state(cfg)
    for past, present in expected:
        if past in borrowed:
            continue
        if past not in eio:
            problems.append(f"{past}: the config has {cfg.num_attention_layers} attention layers but the engine "
                            f"declares no {past}")
        elif pairs.get(past) != present:
            problems.append(f"{past}: the engine declares no output {present} updating it in place")
    kv = cfg.kv_dtype
    for past, _present in pairs_list:
        info = eio[past]
        if not _is_kv_cache(past):
            continue  # a family's per-slot state (a hybrid's recurrent pools): its own dtype and shape
        if info.dtype is not kv:
            problems.append(f"{past}: the engine's KV cache is {info.dtype} but the config's kv_cache_dtype is "
                            f"{kv}")
        shape, top = info.shape, info.max_shape()
        if paged:
            layer = _layer_of(past, names.kPastKeyValuesTemplate)
            heads, dim = cfg.kv_geometry(layer) if layer is not None else (cfg.num_kv_heads, cfg.head_dim)
            want = {0: (2, "K and V"), 2: (cfg.kv_page_size, "kv_page_size"), 3: (heads, "num_kv_heads"),
                    4: (dim, "head_dim")}
            if len(shape) != 5:
                problems.append(f"{past}: expected a paged pool [2, pages, page size, kv heads, head dim], the "
                                f"engine declares rank {len(shape)} {_fmt(shape)}")
                continue
        else:
            want = {1: (cfg.num_kv_heads, "num_kv_heads"), 2: (cfg.max_kv_cache_capacity, "max_kv_cache_capacity"),
                    3: (cfg.head_dim, "head_dim")}
            if len(shape) != 4:
                problems.append(f"{past}: expected a cache [batch, kv heads, capacity, head dim], the engine "
                                f"declares rank {len(shape)} {_fmt(shape)}")
                continue
        for dim, (value, field) in want.items():
            got = shape[dim] if shape[dim] >= 0 else top[dim]
            if got != value:
                problems.append(f"{past}: dim {dim} is {got} in the engine but {value} in the config ({field})")
        if not paged and shape[0] >= 0 and shape[0] < max_batch:
            problems.append(f"{past}: the engine fixes the cache batch to {shape[0]}, smaller than the "
                            f"{max_batch} sequences this setup serves")
    if paged and names.kKVPageTable in eio and not problems and pairs_list:
        # kv_page_table's pool: a full layer's (a family's pool may have a page count of its own: own_sized_pools)
        own = set().union(*(f.own_sized_pools(cfg) for f in cfg.features))
        full_pairs = [past for past, _ in pairs_list if past not in own] or [pairs_list[0][0]]
        pool = eio[full_pairs[0]].max_shape()
        pages = eio[names.kKVPageTable].max_shape()[2]
        need = math.ceil(cfg.max_kv_cache_capacity / cfg.kv_page_size)
        if pages < need:
            problems.append(f"{names.kKVPageTable}: the engine takes {pages} pages per sequence but "
                            f"max_kv_cache_capacity {cfg.max_kv_cache_capacity} needs {need} pages of "
                            f"{cfg.kv_page_size}")
        if pool[1] < max_batch * pages and not pages_on_demand:
            problems.append(f"{pairs_list[0][0]}: the pool holds {pool[1]} pages, fewer than {max_batch} "
                            f"sequences x {pages} pages per sequence = {max_batch * pages}")
        if pool[1] != cfg.kv_pool_pages:
            problems.append(f"{pairs_list[0][0]}: the engine's pool holds {pool[1]} pages but the config's "
                            f"kv_pool_pages is {cfg.kv_pool_pages}")
    return problems


def _table(group: int) -> str:
    """The arena name of a KV commit group's table of cache addresses."""
    return "kv_cache_table" if group == 0 else f"kv_cache_table_{group}"


def _geometry_groups(caches: list[str], shapes: Mapping[str, tuple[int, ...]]) -> list[list[str]]:
    """``caches`` grouped by the geometry of an entry (all dims past the first two: a pool's page, heads and head
    dim; a contiguous cache's), in first-seen order; one empty group without caches."""
    groups: dict[tuple[int, ...], list[str]] = {}
    for name in caches:
        groups.setdefault(tuple(shapes[name][2:]), []).append(name)
    return list(groups.values()) or [[]]


def borrowed_state(cfg: LLMEngineConfig | None) -> set[str]:
    """The pools an engine of ``cfg`` reads but does not own (:meth:`~trtio.features.FamilyConfig.borrowed_state`)."""
    return set().union(*(f.borrowed_state(cfg) for f in cfg.features)) if cfg is not None else set()


def _family_pools(engine_io: EngineIO, cfg: LLMEngineConfig | None, max_batch: int,
                  staged: Mapping[str, Tensor]) -> KVPools:
    """What the families of ``cfg`` change in the engine's KV pools (KV sharing, pools of their own page count, the
    bindings the state owns for them: :meth:`~trtio.features.FamilyConfig.kv_pools`)."""
    pools = KVPools()
    for family in cfg.features if cfg is not None else ():
        found = family.kv_pools(engine_io, cfg, max_batch, staged)
        if found is not None:
            pools.merge(found)
    return pools


class EngineState(Closeable):
    """The in-place state of one engine (see module docstring).

    ``cfg`` (optional) is checked against the engine's declared state; without it only the engine's
    own consistency is checked. Follows trtio's close protocol (:mod:`trtio._lifetime`): :meth:`close`
    frees the state's memory, and is refused (:class:`FrozenError`) while an open executor binds it.
    """

    def __init__(self, engine_io: EngineIO, cfg: LLMEngineConfig | None = None, stream: StreamLike = None, *,
                 max_batch: int, backend: Backend | str | None = None, name: str = "",
                 page_table: Tensor | None = None, staged: Mapping[str, Tensor] | None = None) -> None:
        """``page_table`` (paged caches): the int32 [max_batch, 2, M] table a setup stages each step's rows
        into (pages on demand); without it the state owns a table mapping slot ``b`` to pages ``b*M ..
        b*M + M - 1``, which needs a pool of every slot's pages. ``staged`` (pages on demand): the step block's
        tensors, where a family binds what it stages per step (Gemma 4's bounded SWA rows: :meth:`kv_pools
        <trtio.features.FamilyConfig.kv_pools>`)."""
        self.name = name or engine_io.name
        self.max_batch = max_batch
        self.pairs = engine_io.state_pairs()
        self.layout = kv_layout(engine_io)
        be = get_backend(backend)
        s = as_stream(stream, be)  # orders the page table's and the cache table's first upload
        self._init_lifetime(f"engine state {self.name!r}")  # what it owns frees itself if this is never closed
        self._maps: list[TensorMap] = []
        problems = state_problems(engine_io, cfg, max_batch, pages_on_demand=page_table is not None)
        if problems:
            raise BindingError(engine_io.name, problems)
        self._specs: dict[str, TensorSpec] = {}
        requests = []
        self._max_shape: dict[str, tuple[int, ...]] = {}
        pools = _family_pools(engine_io, cfg, max_batch, staged or {})
        self.shared = pools.shared  # a pool read through another's: nothing allocated for it
        self.kv_parts = pools.parts  # what the families' features keep of the state (a bounded window's pages)
        self._bindings = pools.bindings
        for past, present in self.pairs:
            info = engine_io[past]
            shape = info.max_shape()
            if past in pools.pages:  # the pages a family gives the pool, not the profile's max (may be more)
                shape = (shape[0], pools.pages[past], *shape[2:])
            self._max_shape[past] = shape
            # A KV cache's dynamic batch follows the step's; any other state pool is indexed by slot (state_indices,
            # a hybrid's recurrent states): bound whole.
            lead: Dim = "batch" if info.shape and info.shape[0] < 0 and _is_kv_cache(past) else shape[0]
            sym: tuple[Dim, ...] = (lead, *shape[1:]) if shape else ()
            self._specs[past] = TensorSpec(past, "input", info.dtype, sym)
            self._specs[present] = TensorSpec(present, "output", info.dtype, sym)
            if past not in self.shared:
                requests.append(TensorRequest(past, shape, info.dtype, Location.DEVICE))
        self.pages_per_sequence = 0
        self.pool_pages = 0
        if self.layout == "paged":
            table = engine_io[names.kKVPageTable]
            self.pages_per_sequence = table.max_shape()[2]
            # kv_page_table's pool: a full layer's (a family's pool of its own page count may be smaller)
            full = [past for past, _ in self.pairs if past not in pools.pages]
            # (every pool borrowed, read through another engine's page-table rows: no page of its own)
            pool = self._max_shape[(full or [self.pairs[0][0]])[0]] if self.pairs else (0, 0, KV_PAGE_SIZE)
            self.pool_pages, self.page_size = pool[1], pool[2]
            self._specs[names.kKVPageTable] = TensorSpec(names.kKVPageTable, "input", DType.INT32,
                                                         ("batch", 2, self.pages_per_sequence))
            for binding in self._bindings:  # what the state binds for a family (a table it stages, a carrier)
                self._specs[binding.spec.name] = binding.spec
                if binding.own is not None:
                    requests.append(TensorRequest.of(binding.spec.name, binding.own, binding.spec.dtype))
            if page_table is None:
                requests.append(TensorRequest.of("kv_page_table", (max_batch, 2, self.pages_per_sequence),
                                                 DType.INT32))
            elif page_table.capacity < max_batch * 2 * self.pages_per_sequence * 4:
                raise BindingError(engine_io.name, [
                    f"{names.kKVPageTable}: the staged table holds {page_table.capacity} bytes, {max_batch} slots x 2 "
                    f"x {self.pages_per_sequence} pages need {max_batch * 2 * self.pages_per_sequence * 4}"])
        self.has_start_index = names.kKVCacheStartIndex in engine_io
        if self.has_start_index:
            self._specs[names.kKVCacheStartIndex] = TensorSpec(names.kKVCacheStartIndex, "input", DType.INT32,
                                                               ("start_index_len",))
        requests.append(TensorRequest.of("kv_lengths", (max_batch,), DType.INT32))
        requests.append(UploadRing.request("ring_kv_lengths", (max_batch,), DType.INT32, slots=INPUT_RING_SLOTS))
        # Accepting a verified path moves cache entries: one device operation walks every KV cache from a
        # table of their addresses and a per-step table of moves (one row per sequence).
        self._kv_caches = [p for p, _ in self.pairs if names.is_kv_cache_binding(p) and p not in self.shared]
        self._groups = _geometry_groups(self._kv_caches, self._max_shape)  # one commit per entry geometry
        requests += [TensorRequest.of(_table(i), (max(len(g), 1),), DType.INT64) for i, g in enumerate(self._groups)]
        requests += StepStaging.requests([TensorRequest.of("kv_moves", (max_batch, 3 + MAX_PATH_MOVES),
                                                           DType.INT32)])
        with contextlib.ExitStack() as undo:  # a constructor that fails frees what it made
            self._arena = Arena(requests, backend=be, title=f"{self.name} state")
            undo.callback(self._arena.close)
            self.tensors: dict[str, Tensor] = {past: self._arena[self.shared.get(past, past)] for past, _ in self.pairs}
            self.kv_lengths = self._arena["kv_lengths"]
            self._staging = UploadRing(self._arena["ring_kv_lengths"], be, slots=INPUT_RING_SLOTS,
                                       title=f"{self.name} kv_lengths staging")
            undo.callback(self._staging.close)
            self._moves = StepStaging(self._arena, ["kv_moves"], title=f"{self.name} accepted paths")
            undo.callback(self._moves.close)
            self._move_rows = np.zeros(max_batch * (3 + MAX_PATH_MOVES), np.int32)

            self.page_ids = np.zeros((max_batch, self.pages_per_sequence), np.int64)
            self.page_table: Tensor | None = page_table
            self.pages_on_demand = page_table is not None
            if self.layout == "paged" and page_table is None:
                self.page_table = self._arena["kv_page_table"]
                m = self.pages_per_sequence
                self.page_ids = np.arange(max_batch * m, dtype=np.int64).reshape(max_batch, m)
                rows = np.stack([self.page_ids, self.page_ids + self.pool_pages], axis=1).astype(np.int32)
                self.page_table.copy_from(rows, s)
            self._commit = self._kv_commit(s)
            undo.pop_all()
        self.lengths = np.zeros(max_batch, dtype=np.int64)

    def _kv_commit(self, s: Stream) -> list[KVCommit]:
        """The device work that moves accepted entries in every KV cache (none without KV caches): one per group of
        caches of one entry geometry (a model whose layers differ in KV heads or head dim has several), each with
        its table of the caches' addresses uploaded on ``s``."""
        out = []
        for i, group in enumerate(g for g in self._groups if g):
            cache_table = self._arena[_table(i)]
            cache_table.copy_from(np.array([self.tensors[p].data_ptr for p in group], np.int64), s)
            out.append(KVCommit([self.tensors[p] for p in group], cache_table, self._kv_layout(group[0]),
                                self.page_table))
        return out

    # -- binding ----------------------------------------------------------------------------------
    def specs(self) -> list[TensorSpec]:
        """The specs of every binding the state owns (both names of each pair, the page table or the
        start index): the one source of their shapes."""
        return list(self._specs.values())

    def bind(self, tm: TensorMap) -> None:
        """Add every state binding (both names of each pair, and the page table or start index) to ``tm``."""
        self._check_open()
        self._maps.append(tm)
        for past, present in self.pairs:
            tm.add(past, self.tensors[past])
            tm.add(present, self.tensors[past])
        if self.page_table is not None:
            tm.add(names.kKVPageTable, self.page_table)
            for b in self._bindings:  # a family's: its own tensor (viewed), a staged one, or the page table
                found = b.tensor if b.own is None else self._arena[b.spec.name].reshape(b.view or b.own)
                tm.add(b.spec.name, found if found is not None else self.page_table)
        if self.has_start_index:
            tm.add(names.kKVCacheStartIndex, self.kv_lengths)

    def stable_names(self) -> set[str]:
        """Bindings only this state's executor reshapes (the start index is restaged between steps)."""
        return set(self._specs) - {names.kKVCacheStartIndex}

    def shape_for(self, name: str, batch: int) -> tuple[int, ...]:
        """The bound shape of a state binding for a step of ``batch`` sequences."""
        spec = self._specs[name]
        return tuple(batch if d == "batch" else int(d) for d in spec.shape if not isinstance(d, tuple))

    def shapes(self, batch: int) -> dict[str, tuple[int, ...]]:
        """Bound shapes of every state pair binding (both names) for ``batch``."""
        out = {}
        for past, present in self.pairs:
            out[past] = out[present] = self.shape_for(past, batch)
        return out

    # -- KV bookkeeping -----------------------------------------------------------------------------
    def commit_paths(self, starts: Sequence[int] | np.ndarray, paths: Sequence[Sequence[int]] | np.ndarray,
                     stream: StreamLike = None) -> None:
        """For each sequence slot ``b``, move the cache entry of slot ``starts[b] + paths[b][j]`` to
        ``starts[b] + j`` (every layer, K and V): the accepted path of a verified tree becomes consecutive
        cache entries. One staged copy of the moves and one device operation, whatever the layer count,
        batch and path lengths (graph-capturable: the moves are read when the work runs).

        ``paths`` (see :func:`path_grid`) are strictly increasing node lists starting at the root (checked
        by the caller) of at most ``MAX_PATH_MOVES + 1`` nodes.
        """
        self._check_open()
        grid, lens = path_grid(paths)
        self.commit_grid(starts, grid, lens, stream)

    def commit_grid(self, starts: Sequence[int] | np.ndarray, grid: np.ndarray, lengths: np.ndarray,
                    stream: StreamLike = None) -> tuple[Tensor, int]:
        """:meth:`commit_paths` of paths already laid out by :func:`path_grid` (int64 ``grid`` [batch, L]
        padded with -1, and each path's length); returns where the commit's rows lie on the device and their
        width (:meth:`commit_rows`)."""
        self._check_open()
        if not self._commit:
            raise EngineError(f"state {self.name!r}: the engine has no KV cache whose entries could be moved")
        batch, width = grid.shape
        if width - 1 > MAX_PATH_MOVES:  # a wide grid: its paths may still be short, padded with -1
            if lengths.max(initial=0) - 1 > MAX_PATH_MOVES:
                b = int(np.argmax(lengths))
                raise ShapeError(f"paths[{b}]: {int(lengths[b]) - 1} moved entries, more than the {MAX_PATH_MOVES} "
                                 f"an accepted path may move (a path depth of at most {MAX_PATH_MOVES})")
            width = int(lengths.max(initial=1))
            grid = grid[:, :width]
        # Row b: [start, path length, its nodes]; the device moves every node after the root (an entry
        # already in place is skipped).
        rows = self._move_rows[:batch * (2 + width)].reshape(batch, 2 + width)
        rows[:, 0] = starts[:batch]
        rows[:, 1] = lengths
        rows[:, 2:] = grid
        return self.commit_rows(rows, stream), 2 + width

    def commit_rows(self, rows: np.ndarray, stream: StreamLike = None, *,
                    starts: Tensor | None = None) -> Tensor:
        """:meth:`commit_grid` of its rows, laid out already: int32 [batch, 2 + width], row ``b`` the sequence's
        cached length, its path's length and the path's nodes (at most ``MAX_PATH_MOVES + 1``, checked by the
        caller) padded with -1. ``starts``: the cached lengths on the device instead (int32 [batch], what the
        step before staged there; the rows' first column is then not read), so rows that repeat (a
        :func:`~trtio._staging.constant` the block holds) are not uploaded again. Returns the device tensor whose
        first ``rows.size`` ints hold the rows once the upload has run (until the next commit)."""
        if self._closed:
            self._check_open()
        if not self._commit:
            raise EngineError(f"state {self.name!r}: the engine has no KV cache whose entries could be moved")
        s = as_stream(stream, self._arena.backend)
        moves = self._moves.write("kv_moves", rows)
        self._moves.upload(s)
        for commit in self._commit:
            commit.run(moves, rows.shape[0], rows.shape[1], s, starts=starts)
        return moves

    def _kv_layout(self, name: str) -> KVLayout:
        first = self.tensors[name]
        shape = self._max_shape[name]
        es = first.dtype.itemsize
        if self.layout == "paged":
            _, pool, page, heads, hd = shape
            return KVLayout(paged=True, heads=heads, capacity=page, entry_bytes=heads * hd * es, pool_pages=pool,
                            max_pages=self.pages_per_sequence)
        if len(shape) != 4:
            raise EngineError(f"state {name!r}: {shape} is not a [batch, heads, capacity, head_dim] "
                              f"cache")
        _, heads, cap, hd = shape
        return KVLayout(paged=False, heads=heads, capacity=cap, entry_bytes=hd * es)

    # -- kv lengths -------------------------------------------------------------------------------
    def upload_start_index(self, values: np.ndarray | None, stream: StreamLike = None) -> Tensor:
        """Stage int32 ``values`` [batch] into ``kv_lengths``; None views it as ``[0]`` (empty cache)."""
        if self._closed:  # inline: this runs every step
            raise ClosedError(f"engine state {self.name!r} is closed")
        if values is None:
            return self.kv_lengths.reshape((0,))
        return self._staging.upload(np.asarray(values, dtype=np.int32), self.kv_lengths, stream)

    def reset(self, stream: StreamLike = None, *, clear: bool = False) -> None:
        """Forget every cached token (lengths to 0); ``clear=True`` also zeroes the state tensors."""
        self._check_open()
        self.lengths[:] = 0
        if clear:
            for t in self.tensors.values():
                t.zero_(stream)

    # -- reporting and lifetime ---------------------------------------------------------------------
    @property
    def nbytes(self) -> int:
        return sum(t.capacity for p, t in self.tensors.items() if p not in self.shared)

    def memory_report(self) -> MemoryReport:
        self._check_open()
        return self._arena.report()

    def _closable(self) -> bool:
        users = sorted({u for tm in self._maps for u in tm.open_users()} | set(open_binders(self._arena)))
        if users:
            raise FrozenError(f"engine state {self.name!r} is bound by open executor(s) {users}: freeing it would "
                              f"leave their engines writing to freed memory; close the setup first")
        return super()._closable()

    def _close_owned(self) -> None:
        with contextlib.ExitStack() as release:  # each part is released even if another fails
            release.callback(self._arena.close)  # it unfreezes its tensors (bound in frozen maps) first
            release.callback(self._moves.close)
            release.callback(self._staging.close)
            for commit in self._commit:
                release.callback(commit.close)

    def __repr__(self) -> str:
        return (f"EngineState({self.name!r}, {self.layout}, {len(self.pairs)} pairs, "
                f"{math.ceil(self.nbytes / (1 << 20))} MiB)")

