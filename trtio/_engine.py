"""Engines: introspection (EngineIO), shared context memory, and the executor that binds and runs.

Everything here talks to engines through TensorRT 10/11's Python API names only, so TensorRT,
TensorRT-RTX and :class:`trtio.testing.ReferenceEngine` are handled by the same code.

:class:`EngineExecutor` owns one execution context. ``prepare`` checks every binding and tells
TensorRT only what changed; when nothing changed since the last step (same profile, same dims,
same tensor map generation) it does no TensorRT call at all, which the pointer-stability
invariant makes safe. ``execute`` enqueues, or replays a CUDA graph captured for the current
binding snapshot.
"""

from __future__ import annotations

import contextlib
import logging
import math
import weakref
from collections import OrderedDict
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from trtio import names as _names
from trtio._cuda.backend import Backend, Location, destroy_graphs, get_backend
from trtio._dims import InferenceDims
from trtio._dtypes import DType
from trtio._lifetime import Closeable
from trtio._memory import MemoryEntry, MemoryReport
from trtio._registry import TensorRegistry
from trtio._stream import Stream, StreamLike, as_stream
from trtio._tensor import FIXED_VIEW, VIEWS, Tensor, ViewLog, unmark_bound_memory
from trtio._tensor_map import TensorMap
from trtio._trt import module_of
from trtio.errors import BindingError, EngineError, FrozenError, TrtioError, UnknownNameError

__all__ = ["TensorInfo", "EngineIO", "ContextMemory", "DeviceWork", "EngineExecutor", "GraphStats", "PREFILL_PROFILE",
           "DECODE_PROFILE"]

log = logging.getLogger("trtio")

PREFILL_PROFILE = 0  # Edge-LLM: profile 0 = context / prefill
DECODE_PROFILE = 1  # profile 1 = decode, verify, proposal, accept
CONTEXT_MEMORY_ALIGNMENT = 512


def _enum_name(x: Any) -> str:
    name = getattr(x, "name", None)
    return name if isinstance(name, str) else str(x).rsplit(".", 1)[-1]


def _fmt(shape: Sequence[int]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


@dataclass(frozen=True)
class TensorInfo:
    """One engine I/O tensor as the engine declares it."""

    index: int
    name: str
    mode: str  # "input" | "output"
    dtype: DType
    shape: tuple[int, ...]  # -1 = dynamic
    location: Location  # DEVICE or HOST
    is_shape_tensor: bool
    profiles: tuple[tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]], ...] = ()  # inputs: (min, opt, max)
    aliased_input: str | None = None  # outputs updated in place (KV caches)

    @property
    def is_input(self) -> bool:
        return self.mode == "input"

    def max_shape(self) -> tuple[int, ...]:
        """The largest shape over all profiles (the engine shape for outputs and static inputs)."""
        if not self.profiles:
            return self.shape
        return tuple(max(p[2][i] for p in self.profiles) for i in range(len(self.shape)))

    def max_bytes(self) -> int:
        shape = self.max_shape()
        if any(d < 0 for d in shape):
            return -1
        return self.dtype.nbytes(math.prod(shape))

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index, "name": self.name, "mode": self.mode, "dtype": str(self.dtype),
            "shape": list(self.shape), "location": str(self.location), "is_shape_tensor": self.is_shape_tensor,
            "profiles": [{"min": list(a), "opt": list(b), "max": list(c)} for a, b, c in self.profiles],
            "aliased_input": self.aliased_input,
        }


@dataclass(frozen=True)
class EngineIO:
    """Every I/O tensor of an engine, in the engine's order."""

    name: str
    tensors: tuple[TensorInfo, ...]
    num_profiles: int

    @classmethod
    def from_engine(cls, engine: Any) -> EngineIO:
        """Introspect ``engine`` (TensorRT, TensorRT-RTX or ReferenceEngine)."""
        n_profiles = int(engine.num_optimization_profiles)
        has_alias = hasattr(engine, "get_aliased_input_tensor")
        infos = []
        for i in range(int(engine.num_io_tensors)):
            name = engine.get_tensor_name(i)
            mode = "input" if _enum_name(engine.get_tensor_mode(name)) == "INPUT" else "output"
            dtype = DType.from_trt(engine.get_tensor_dtype(name))
            shape = tuple(int(d) for d in engine.get_tensor_shape(name))
            location = Location.DEVICE if _enum_name(engine.get_tensor_location(name)) == "DEVICE" else Location.HOST
            is_shape = bool(engine.is_shape_inference_io(name)) if hasattr(engine, "is_shape_inference_io") else False
            profiles: tuple[Any, ...] = ()
            alias = None
            if mode == "input" and all(d >= 0 for d in shape):
                profiles = ((shape, shape, shape),) * n_profiles  # static: every profile is the shape
            elif mode == "input":
                profiles = tuple(
                    tuple(tuple(int(d) for d in dims) for dims in engine.get_tensor_profile_shape(name, p))
                    for p in range(n_profiles))
            else:
                if has_alias:
                    alias = engine.get_aliased_input_tensor(name) or None
                if alias is None:
                    alias = _names.past_name_for_present(name)
            infos.append(TensorInfo(i, name, mode, dtype, shape, location, is_shape, profiles, alias))
        # An alias from the naming convention only counts if the engine really has that input.
        inputs = {t.name for t in infos if t.is_input}
        infos = [t if t.aliased_input is None or t.aliased_input in inputs else
                 TensorInfo(t.index, t.name, t.mode, t.dtype, t.shape, t.location, t.is_shape_tensor, t.profiles, None)
                 for t in infos]
        return cls(str(getattr(engine, "name", "") or "engine"), tuple(infos), n_profiles)

    def __getitem__(self, name: str) -> TensorInfo:
        for t in self.tensors:
            if t.name == name:
                return t
        raise UnknownNameError(f"engine {self.name!r} has no tensor {name!r}")

    def __contains__(self, name: object) -> bool:
        return any(t.name == name for t in self.tensors)

    def names(self) -> list[str]:
        return [t.name for t in self.tensors]

    @property
    def inputs(self) -> list[TensorInfo]:
        return [t for t in self.tensors if t.is_input]

    @property
    def outputs(self) -> list[TensorInfo]:
        return [t for t in self.tensors if not t.is_input]

    def state_pairs(self) -> list[tuple[str, str]]:
        """(input, output) pairs where the output updates the input in place."""
        return [(t.aliased_input, t.name) for t in self.outputs if t.aliased_input]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "num_profiles": self.num_profiles, "tensors": [t.to_dict() for t in self.tensors]}


class ContextMemory(Closeable):
    """One USER_MANAGED device buffer that several execution contexts share.

    Sized to the maximum over the engines and their profiles; the contexts must run serially
    (one stream, or streams ordered with events), as base and draft do.

    Follows trtio's close protocol (:mod:`trtio._lifetime`): :meth:`close` frees the memory, and is
    refused (:class:`FrozenError`) while an open executor uses it: its execution context (and any
    graph captured from it) would run in freed memory.
    """

    def __init__(self, nbytes: int, *, backend: Backend | str | None = None, name: str = "context_memory") -> None:
        self.nbytes = max(int(nbytes), CONTEXT_MEMORY_ALIGNMENT)
        self._tensor = Tensor.empty((self.nbytes + CONTEXT_MEMORY_ALIGNMENT,), DType.UINT8, Location.DEVICE,
                                    name=name, backend=backend)
        base = self._tensor.data_ptr
        self.ptr = (base + CONTEXT_MEMORY_ALIGNMENT - 1) // CONTEXT_MEMORY_ALIGNMENT * CONTEXT_MEMORY_ALIGNMENT
        self._users: weakref.WeakSet[EngineExecutor] = weakref.WeakSet()  # executors whose contexts use it
        # The view log of the tensors its executors bind (Tensor._log): they run one at a time, so one thread
        # writes it; another setup's executors (another thread, another rank) have their own.
        self.views = ViewLog()
        self._init_lifetime(f"context memory {name!r}")  # the tensor frees itself if this is never closed

    @staticmethod
    def required_bytes(engine: Any) -> int:
        need = int(engine.device_memory_size_v2)
        if hasattr(engine, "get_device_memory_size_for_profile_v2"):
            for p in range(int(engine.num_optimization_profiles)):
                need = max(need, int(engine.get_device_memory_size_for_profile_v2(p)))
        return need

    @classmethod
    def for_engines(cls, engines: Iterable[Any], *, backend: Backend | str | None = None) -> ContextMemory:
        return cls(max((cls.required_bytes(e) for e in engines), default=0), backend=backend)

    @property
    def capacity(self) -> int:
        return self.nbytes

    def _add_user(self, executor: EngineExecutor) -> None:
        self._check_open()
        self._users.add(executor)

    def report(self) -> MemoryReport:
        self._check_open()
        rep = MemoryReport("context memory")
        rep.entries.append(MemoryEntry("context_memory", (self.nbytes,), "uint8", "device", self.nbytes))
        rep.allocated["device"] = self._tensor.capacity  # includes the alignment slack
        rep.allocations["device"] = 1
        return rep

    def check(self, engine: Any, engine_name: str) -> None:
        self._check_open()
        need = self.required_bytes(engine)
        if need > self.nbytes:
            raise EngineError(
                f"context memory of {self.nbytes} bytes is too small for engine {engine_name!r}, which needs "
                f"{need} bytes (max of device_memory_size_v2 and every profile); size it with "
                f"ContextMemory.for_engines([...]) over every engine that shares it")

    def _closable(self) -> bool:
        users = sorted(e.name for e in list(self._users) if not e.is_closed)
        if users:
            raise FrozenError(f"context memory {self._tensor.name!r} is used by open executor(s) {users}: freeing "
                              f"it would leave their execution contexts (and captured graphs) running in freed "
                              f"memory; close the executors (or the setup) first")
        return super()._closable()

    def _close_owned(self) -> None:
        self._tensor.close()

    def __repr__(self) -> str:
        state = ", closed" if self._closed else ""
        return f"ContextMemory({self.nbytes} bytes at 0x{self.ptr:x}{state})"


@dataclass
class GraphStats:
    """CUDA-graph cache telemetry: a miss is a step whose binding snapshot had no graph yet."""

    hits: int = 0
    captures: int = 0
    misses: int = 0
    last_miss_reason: str = ""
    graphs: int = 0


class DeviceWork(Protocol):
    """Device work a step enqueues before its engine (:class:`trtio._ops.RowCopy`, :class:`trtio._ops.Zero`):
    captured with the engine in one graph. Hashable; equal values are the same work (they read what they
    need, e.g. row indices, from device memory when they run)."""

    def enqueue(self, stream: Stream) -> None: ...


@dataclass
class _Plan:
    """What a slow-path prepare checked and bound, replayed by later steps with the same key."""

    key: tuple[Any, ...]
    views: list[tuple[Tensor, tuple[int, ...], int]] = field(default_factory=list)  # shared tensors' views, bytes
    all_views: list[tuple[Tensor, tuple[int, ...], int]] = field(default_factory=list)  # every view, with bytes
    outputs: list[Tensor] = field(default_factory=list)
    snapshot: tuple[Any, ...] = ()  # (profile, (name, address, shape), ...): what the execution context must hold
    inputs: frozenset[str] = frozenset()
    graph: int | None = None  # the graph of this snapshot and `graph_before`, once looked up or captured
    graph_before: tuple[DeviceWork, ...] = ()
    # By the work before the engine, found by identity (the work tuple is kept beside its graph): (work, graph)
    graphs: dict[int, tuple[tuple[DeviceWork, ...], int]] = field(default_factory=dict)
    view_changes: int = -1  # its executor's view log's count when this plan's views were last known set
    foreign: bool = False  # it holds a tensor of another owner's view log: its views are set at every step
    by_tensor: dict[int, tuple[Tensor, tuple[int, ...], int]] = field(default_factory=dict)  # views, by id(tensor)
    stable_views: list[tuple[Tensor, tuple[int, ...], int]] = field(default_factory=list)  # the executor's own
    # Per plan switched from (by id; the plan is kept beside its lists): the views to set (see switch_from).
    switches: dict[int, _Switch] = field(default_factory=dict)
    after: _Switch | None = None  # the last switch from this plan to another: a round's next step is found by it
    dropped: bool = False  # no longer among its executor's plans (the oldest, forgotten): never used again
    fixed: tuple[Tensor, ...] = ()  # tensors of a fixed view it binds (fix_view): in no list of views

    def switch_from(self, prev: _Plan, log: ViewLog) -> _Switch:
        """The views to set where the executor's own tensors (those of its view ``log``) hold ``prev``'s
        views: see :class:`_Switch`."""
        found = self.switches.get(id(prev))
        if found is None or found.prev is not prev:
            if len(self.switches) >= _PLAN_CACHE:
                self.switches.clear()
            before = {id(t): shp for t, shp, _n in prev.stable_views}
            own = [v for v in self.stable_views if before.get(id(v[0])) != v[1]]
            before = {id(t): shp for t, shp, _n in prev.all_views}
            differ = [v for v in self.all_views if before.get(id(v[0])) != v[1]]
            # A tensor's log is fixed once an executor bound it (Tensor._log leaves VIEWS once, in _remember).
            found = self.switches[id(prev)] = _Switch(prev, self, self.views + own, differ,
                                                      all(v[0]._log is log for v in self.all_views))
        return found


@dataclass
class _Switch:
    """The views a plan (``target``) sets where the plan held before was ``prev``: ``views`` where only the
    executor's own tensors are known to hold ``prev``'s views (the shared ones are tested one by one); ``differ``,
    every view whose shape differs from ``prev``'s, where all of them hold ``prev``'s views (no view of the
    executor's log changed since ``prev`` set them). ``own_log``: every tensor of the plan reports to the
    executor's view log, so setting views of them is one count of that log (:func:`_set_views`)."""

    prev: _Plan
    target: _Plan
    views: list[tuple[Tensor, tuple[int, ...], int]]
    differ: list[tuple[Tensor, tuple[int, ...], int]]
    own_log: bool


def _apply_views(views: list[tuple[Tensor, tuple[int, ...], int]]) -> None:
    """Set each tensor's view to a plan's shape. Views are set to the plan's own shape tuples, so an
    untouched view costs one identity test; a closed tensor raises, naming itself.

    A tensor's view before (``Tensor._prev_view``) is left as it was: any (shape, bytes) pair it once held stays
    a valid view of it (its dtype and capacity never change), and a plan's view set back is set here."""
    changed: ViewLog | None = None  # the log of the last view changed, counted once it is another's or at the end
    for t, shp, nbytes in views:
        if t._closed:
            t._live()
        if t._shape is not shp:  # checked against the capacity when the plan was made (Tensor._set_view, inlined)
            t._shape = shp
            t._nbytes = nbytes
            log = t._log
            if log is not changed:
                if changed is not None:
                    changed.last = 0
                    changed.changes += 1
                changed = log
    if changed is not None:
        changed.last = 0
        changed.changes += 1


def _set_views(views: list[tuple[Tensor, tuple[int, ...], int]], log: ViewLog) -> None:
    """:func:`_apply_views` of tensors that all report to one view ``log`` (a switch of ``own_log``): one count of
    it, made first (a closed tensor that raises half way leaves the count moved on), even where no view differs
    (a few plans then test their views again)."""
    if not views:
        return
    log.last = 0
    log.changes += 1
    for t, shp, nbytes in views:
        if t._closed:
            t._live()
        if t._shape is not shp:
            t._shape = shp
            t._nbytes = nbytes


def _views_again(plan: _Plan, log: ViewLog) -> None:
    """Set the views of ``plan``'s shared tensors again after its executor's view ``log`` counted changes since
    it last did: where the one change since was the reshape of one of them (:attr:`ViewLog.last`), that one
    alone; else all of them (a plan that holds another owner's tensor: all of them, at every step)."""
    changes = log.changes
    # A plan holds its tensors, so an id it finds is of a tensor alive since before its views were last set.
    view = plan.by_tensor.get(log.last) if changes == plan.view_changes + 1 else None
    if view is not None:  # one reshape since: of t, alone
        t = view[0]
        if t._shape is not view[1]:
            if t._closed:
                t._live()
            # The view it was given, checked then, is its view before: given again (a runtime writing its next
            # step's inputs through that view), Tensor.reshape takes it back without a check.
            t._prev_view = (t._shape, t._nbytes)
            t._shape, t._nbytes = view[1], view[2]
            log.changes = changes = changes + 1  # t alone changed: it is still the last one
    elif plan.foreign:
        _apply_views(plan.views)
    else:  # every tensor of its views reports to `log`
        _set_views(plan.views, log)
        changes = log.changes
    plan.view_changes = -1 if plan.foreign else changes


def _binding_problems(info: TensorInfo, t: Tensor, shape: tuple[int, ...], profile: int) -> list[str]:
    """What is wrong with binding ``t`` at ``shape`` to the engine tensor ``info`` on ``profile``: dtype,
    location, rank (nothing more is checked at a wrong rank), fixed dims, the profile range, capacity."""
    kind = "input" if info.is_input else "output"
    problems = []
    if t.dtype is not info.dtype:
        problems.append(f"{info.name}: dtype {t.dtype} (tensor {t.name!r}) but the engine {kind} is {info.dtype}")
    want_device = info.location is Location.DEVICE
    if want_device != (t.location is Location.DEVICE):
        problems.append(f"{info.name}: location {t.location} (tensor {t.name!r}) but the engine {kind} "
                        f"lives on {'the device' if want_device else 'the host'}")
    if len(shape) != len(info.shape):
        problems.append(f"{info.name}: shape {_fmt(shape)} has rank {len(shape)} but the engine {kind} "
                        f"{_fmt(info.shape)} has rank {len(info.shape)}")
        return problems
    fixed = [(i, d, e) for i, (d, e) in enumerate(zip(shape, info.shape)) if e >= 0 and d != e]
    if fixed:
        i, d, e = fixed[0]
        problems.append(f"{info.name}: shape {_fmt(shape)} has {d} in dim {i} where the engine {kind} "
                        f"{_fmt(info.shape)} fixes {e}")
    if info.is_input and info.profiles:
        lo, _, hi = info.profiles[profile]
        if any(d < a or d > b for d, a, b in zip(shape, lo, hi)):
            problems.append(f"{info.name}: shape {_fmt(shape)} is outside profile {profile}'s range "
                            f"min {_fmt(lo)} .. max {_fmt(hi)}")
    need = t.dtype.nbytes(math.prod(shape))
    if need > t.capacity:
        problems.append(f"{info.name}: shape {_fmt(shape)} needs {need} bytes but tensor {t.name!r} "
                        f"holds {t.capacity} bytes")
    return problems


_PLAN_CACHE = 32  # binding plans an executor remembers (steps alternate a few: proposal, catch-up, ...)


class EngineExecutor(Closeable):
    """One execution context of an engine, bound to trtio tensors (see module docstring).

    Follows trtio's close protocol (:mod:`trtio._lifetime`): :meth:`close` destroys the captured graphs,
    drops the execution context and frees the context memory it made for itself (a shared
    :class:`ContextMemory` stays with its owner); an executor never closed has its graphs destroyed by
    the garbage collector, with a warning.
    """

    def __init__(self, engine: Any, *, context_memory: ContextMemory | None = None, name: str = "",
                 registry: TensorRegistry | None = None, stable: Iterable[str] = (), graphs: bool = False,
                 backend: Backend | str | None = None) -> None:
        self.engine = engine
        self.io = EngineIO.from_engine(engine)
        self.name = name or self.io.name
        self.registry = registry
        self.graphs_enabled = graphs
        self._backend = get_backend(backend)
        self._stable = set(stable)  # bindings only this executor reshapes (its state): left out of the fast path
        self._own_memory = context_memory is None
        with contextlib.ExitStack() as undo:  # a constructor that fails frees the memory it made
            if context_memory is None:
                context_memory = ContextMemory.for_engines([engine], backend=self._backend)
                undo.callback(context_memory.close)
            self.context_memory = context_memory
            self._views = context_memory.views  # the view log of the tensors its plans hold
            context_memory.check(engine, self.name)  # a closed one is refused here
            trt = module_of(engine)
            strategy = trt.ExecutionContextAllocationStrategy.USER_MANAGED
            self.context = engine.create_execution_context(strategy)
            if self.context is None:
                raise EngineError(f"engine {self.name!r}: create_execution_context returned None")
            self.context.set_device_memory(context_memory.ptr, context_memory.nbytes)
            undo.pop_all()
        self._profile: int | None = None
        self._bound_addr: dict[str, int] = {}
        self._bound_shape: dict[str, tuple[int, ...]] = {}
        self._plan: _Plan | None = None
        self._plans: OrderedDict[tuple[Any, ...], _Plan] = OrderedDict()  # checked plans, by key (most recent last)
        self._synced: _Plan | None = None  # the plan whose bindings the execution context holds
        self._stable_of: _Plan | None = None  # the plan whose views the executor's own tensors hold (None: unknown)
        self._graphs: dict[tuple[Any, ...], int] = {}
        self._last_snapshot: tuple[Any, ...] | None = None
        self._last_before: tuple[DeviceWork, ...] = ()
        self.graph_stats = GraphStats()
        # How much of the last execute() reached the stream: the works of its `before` enqueued, plus 1 once the
        # engine's work was (a graph launched: all of them). A step that fails reads it to tell what its own
        # device work has already changed.
        self.enqueued = 0
        self.last_work: tuple[DeviceWork, ...] = ()  # the device work the last execute() ran before its engine
        self._dummy: Tensor | None = None
        # An executor dropped without close() must not leak its graphs (they pin device memory).
        self._init_lifetime(f"executor {self.name!r}", destroy_graphs, self._backend, self._graphs)
        self.context_memory._add_user(self)

    # -- binding ----------------------------------------------------------------------------------
    def _dummy_ptr(self) -> int:
        # TensorRT refuses null addresses: empty tensors are bound to a small shared buffer.
        if self._dummy is None:
            self._dummy = Tensor.empty((256,), DType.UINT8, Location.DEVICE, name=f"{self.name}.dummy",
                                       backend=self._backend)
        return self._dummy.data_ptr

    def prepare(self, profile: int, tensor_map: TensorMap, dims: InferenceDims, stream: StreamLike = None) -> None:
        """Bind ``tensor_map`` for a step of ``dims`` on optimization ``profile``.

        Every engine I/O gets its tensor from the map; its shape comes from the registry spec
        (resolved against ``dims``; the setups' registries include the engine state's own specs), else
        from the tensor's own view. dtype, location, capacity, rank and the profile range are checked
        for every binding, and all problems are raised together as one :class:`BindingError`. TensorRT
        is told only what changed: a step identical to the previous one makes no TensorRT call.
        """
        if self._closed:
            self._check_open()
        key = (profile, dims, id(tensor_map), tensor_map.generation)
        plan = self._plan
        # The held plan's dims are tested by identity first (a setup keeps one object per step shape): a switch
        # between plans then costs no field-by-field comparison of dims that differ; equal dims of another object
        # find the plan among the cached ones below.
        if plan is not None and plan.key[1] is dims and plan.key == key:
            if plan.view_changes != self._views.changes:  # a view of this owner changed since the plan set its own
                _views_again(plan, self._views)
            return
        if plan is not None and plan.after is not None and self._stable_of is plan:
            # The step the last switch from the held plan went to (a round alternates a few steps): found without
            # hashing the key, by the same identity test of the dims.
            switch = plan.after
            target = switch.target
            k = target.key
            if k[1] is dims and not target.dropped and k[0] == profile and k[2] == key[2] and k[3] == key[3]:
                self._switch_to(plan, switch)
                return
        cached = self._plans.get(key)
        if cached is not None:
            # A step this executor checked before (a spec-decode round alternates a few): re-apply its views (of
            # the executor's own tensors, those that differ from the plan they hold). The execution context is
            # brought in line only if it has to enqueue (a graph replay needs nothing).
            held = self._stable_of
            if held is None:
                _apply_views(cached.all_views)
            elif held is cached:
                _apply_views(cached.views)
            else:  # one pass over the views that differ from the held plan's (see _Plan.switch_from)
                self._switch_to(held, cached.switch_from(held, self._views))
                return
            self._stable_of = cached
            cached.view_changes = -1 if cached.foreign else self._views.changes
            self._plans.move_to_end(key)
            self._plan = cached
            return
        self._prepare_slow(profile, tensor_map, dims, as_stream(stream, self._backend), key)

    def _switch_to(self, held: _Plan, switch: _Switch) -> None:
        """Make ``switch.target`` (a cached plan) the plan, from ``held`` (the plan whose views the executor's own
        tensors hold): the views that differ set in one pass."""
        views = self._views
        todo = switch.differ if held.view_changes == views.changes else switch.views
        if switch.own_log:
            _set_views(todo, views)
        else:
            _apply_views(todo)
        target = switch.target
        held.after = switch
        self._stable_of = self._plan = target
        target.view_changes = -1 if target.foreign else views.changes
        self._plans.move_to_end(target.key)

    def _prepare_slow(self, profile: int, tm: TensorMap, dims: InferenceDims, stream: Stream,
                      key: tuple[Any, ...]) -> None:
        """Check every binding of a step not seen before, bind what changed, and remember it as a plan."""
        self._plan = self._stable_of = None  # until the new plan is bound: the views may be half set
        if not 0 <= profile < self.io.num_profiles:
            raise BindingError(self.name, [f"profile {profile} does not exist (engine has {self.io.num_profiles})"])
        if self.registry is not None:
            dims.check(s for spec in self.registry if spec.name in self.io for s in spec.members())
        planned, problems = self._planned_bindings(profile, tm, dims)
        problems += self._alias_problems(tm)
        if problems:
            raise BindingError(self.name, problems)
        self._bind(profile, planned, stream)
        self._check_output_shapes(planned)
        self._remember(key, profile, planned, tm)

    def _planned_bindings(self, profile: int, tm: TensorMap,
                          dims: InferenceDims) -> tuple[list[tuple[TensorInfo, Tensor, tuple[int, ...]]], list[str]]:
        """(engine tensor, trtio tensor, shape) of every binding that passes its checks, and every problem."""
        problems: list[str] = []
        planned: list[tuple[TensorInfo, Tensor, tuple[int, ...]]] = []
        for info in self.io.tensors:
            t = tm.get(info.name)
            if t is None:
                what = "unbound engine input" if info.is_input else "missing output binding"
                problems.append(f"{info.name}: {what} ({info.dtype} {_fmt(info.shape)}); "
                                f"tensor map {tm.name!r} has no such entry")
                continue
            spec = self.registry.get(info.name) if self.registry is not None else None
            shape = spec.resolve(dims) if spec is not None else t._shape
            found = _binding_problems(info, t, shape, profile)
            if found:
                problems += found
            else:
                planned.append((info, t, shape))
        return planned, problems

    def _alias_problems(self, tm: TensorMap) -> list[str]:
        """An output that updates an input in place must be bound to the input's address."""
        problems = []
        for info in self.io.outputs:
            if info.aliased_input and info.name in tm and info.aliased_input in tm:
                if tm[info.name].data_ptr != tm[info.aliased_input].data_ptr:
                    problems.append(f"{info.name}: updates {info.aliased_input} in place, so both must be bound to "
                                    f"one address (got 0x{tm[info.name].data_ptr:x} and "
                                    f"0x{tm[info.aliased_input].data_ptr:x})")
        return problems

    def _bind(self, profile: int, planned: list[tuple[TensorInfo, Tensor, tuple[int, ...]]], stream: Stream) -> None:
        """Tell the execution context every address and input shape that changed; one BindingError lists every
        call TensorRT refused."""
        problems = []
        ctx = self.context
        self._use_profile(profile, stream)
        for info, t, shape in planned:
            if t._shape != shape:
                t.reshape(shape)
            ptr = t.data_ptr if t.capacity else self._dummy_ptr()
            if self._bound_addr.get(info.name) != ptr:
                if not ctx.set_tensor_address(info.name, ptr):
                    problems.append(f"{info.name}: set_tensor_address(0x{ptr:x}) returned False")
                else:
                    self._bound_addr[info.name] = ptr
            if info.is_input and self._bound_shape.get(info.name) != shape:
                if not ctx.set_input_shape(info.name, shape):
                    lo, _, hi = info.profiles[profile] if info.profiles else ((), (), ())
                    problems.append(f"{info.name}: set_input_shape({_fmt(shape)}) returned False "
                                    f"(profile {profile}: min {_fmt(lo)} .. max {_fmt(hi)})")
                    self._bound_shape.pop(info.name, None)
                else:
                    self._bound_shape[info.name] = shape
        if problems:
            raise BindingError(self.name, problems)

    def _check_output_shapes(self, planned: list[tuple[TensorInfo, Tensor, tuple[int, ...]]]) -> None:
        """The shapes the engine computes for its outputs must be the bindings' shapes."""
        problems = []
        for info, _t, shape in planned:
            if not info.is_input:
                got = tuple(int(d) for d in self.context.get_tensor_shape(info.name))
                if got != shape:
                    problems.append(f"{info.name}: the engine computes output shape {_fmt(got)} but the binding "
                                    f"expects {_fmt(shape)}")
        if problems:
            raise BindingError(self.name, problems)

    def _remember(self, key: tuple[Any, ...], profile: int,
                  planned: list[tuple[TensorInfo, Tensor, tuple[int, ...]]], tm: TensorMap) -> None:
        """Keep what this step checked and bound as the plan of ``key``, for the fast path of later steps. Tensors
        of a fixed view (:func:`~trtio._tensor.fix_view`) are bound (in the snapshot) but left out of its views."""
        bound = planned
        fixed = tuple(t for _i, t, _s in planned if t._log is FIXED_VIEW)
        if fixed:
            planned = [p for p in planned if p[1]._log is not FIXED_VIEW]
        all_views = [(t, shape, t.dtype.nbytes(math.prod(shape))) for _i, t, shape in planned]
        own = self._views
        for t, _shape, _nbytes in all_views:
            if t._log is VIEWS:  # bound by no executor yet: this owner's from now on
                t._log = own
        for t, shape, nbytes in all_views:
            t._set_view(shape, nbytes)  # the plan's own tuple: the fast path tests views by identity
        views = [v for (info, _t, _s), v in zip(planned, all_views) if info.name not in self._stable]
        stable_views = [v for (info, _t, _s), v in zip(planned, all_views) if info.name in self._stable]
        outputs = [t for info, t, _ in planned if not info.is_input and info.aliased_input is None]
        snapshot = (profile,) + tuple((info.name, self._bound_addr[info.name], shape) for info, t, shape in bound)
        inputs = frozenset(info.name for info, _t, _s in bound if info.is_input)
        plan = _Plan(key, views, all_views, outputs, snapshot, inputs, stable_views=stable_views,
                     by_tensor={id(v[0]): v for v in views}, foreign=any(v[0]._log is not own for v in views),
                     fixed=fixed)
        plan.view_changes = -1 if plan.foreign else own.changes
        self._plan = self._synced = self._stable_of = plan
        self._plans[key] = plan
        while len(self._plans) > _PLAN_CACHE:
            self._plans.popitem(last=False)[1].dropped = True
        tm.add_user(self)

    def _use_profile(self, profile: int, stream: Stream) -> None:
        """Switch the context to optimization ``profile`` on ``stream`` if it is on another one; TensorRT then
        wants every input shape set again."""
        if profile == self._profile:
            return
        try:
            self.context.set_optimization_profile_async(profile, stream.handle)
        except Exception as exc:
            raise EngineError(f"engine {self.name!r}: set_optimization_profile_async({profile}) failed: "
                              f"{exc}") from exc
        self._profile = profile
        self._bound_shape.clear()

    def _sync(self, plan: _Plan, stream: Stream) -> None:
        """Bring the execution context in line with ``plan`` (checked when it was made): only what differs
        from what the context holds is set."""
        if self._synced is plan:
            return
        ctx = self.context
        self._use_profile(plan.snapshot[0], stream)
        for name, ptr, shape in plan.snapshot[1:]:
            if self._bound_addr.get(name) != ptr:
                if not ctx.set_tensor_address(name, ptr):
                    raise EngineError(f"engine {self.name!r}: {name}: set_tensor_address(0x{ptr:x}) returned False")
                self._bound_addr[name] = ptr
            if name in plan.inputs and self._bound_shape.get(name) != shape:
                if not ctx.set_input_shape(name, shape):
                    self._bound_shape.pop(name, None)
                    raise EngineError(f"engine {self.name!r}: {name}: set_input_shape({_fmt(shape)}) returned False")
                self._bound_shape[name] = shape
        self._synced = plan

    # -- execution: a prepared step run plainly, or as a CUDA graph captured once per binding snapshot --------
    def execute(self, stream: StreamLike = None, *, use_graph: bool | None = None,
                before: tuple[DeviceWork, ...] = ()) -> None:
        """Enqueue the engine on ``stream`` (after :meth:`prepare`), after the device work ``before``
        (e.g. :class:`trtio._ops.RowCopy` values: the inputs the step gathers on the device).

        With graphs, the first step of each binding snapshot and ``before`` runs un-captured (TensorRT's
        lazy initialisation) and is then captured with ``before`` in one graph, which later steps with the
        same snapshot and equal ``before`` replay (a capture that fails after that first run costs only the
        graph: see :meth:`_capture`). A step runs once: ``before`` need not be idempotent (a move may read
        what the engine writes).

        When it raises, :attr:`enqueued` says how far it got: the works of ``before`` that reached the stream,
        plus 1 once the engine's work did (a step whose device work overwrote what it reads cannot simply
        be run again then).
        """
        if self._closed:
            self._check_open()
        self.enqueued = 0
        self.last_work = before
        plan = self._plan
        if plan is None:
            raise EngineError(f"engine {self.name!r}: execute() before a successful prepare()")
        s = as_stream(stream, self._backend)
        if use_graph if use_graph is not None else self.graphs_enabled:
            graph = plan.graph if plan.graph_before is before else None
            captured = False
            if graph is None:
                # A step that alternates between works (a round's levels): each work's graph, by identity.
                found = plan.graphs.get(id(before))
                if found is not None and found[0] is before:
                    graph = found[1]
                else:
                    key = (plan.snapshot, before)
                    graph = self._graphs.get(key)  # hashing the snapshot: once per new plan or new `before`
                    if graph is None:
                        self._sync(plan, s)
                        graph, captured = self._capture(key, s), True
                    if len(plan.graphs) >= _PLAN_CACHE:  # works made afresh per step would grow it without bound
                        plan.graphs.clear()
                    plan.graphs[id(before)] = (before, graph)
                plan.graph, plan.graph_before = graph, before
            if captured:
                pass  # the capture's warm-up was this step: the graph (or plain execution) serves the next ones
            elif graph:
                self.graph_stats.hits += 1
                self._backend.launch_graph(graph, s.handle)  # the graph holds its bindings: no context sync
                self.enqueued = len(before) + 1
            else:
                self._sync(plan, s)
                self._enqueue(s, before)  # this binding snapshot cannot be captured (graph_stats says why)
        else:
            self._sync(plan, s)
            self._enqueue(s, before)
        for t in plan.outputs:
            t._last_stream = s

    def replay(self, profile: int, tensor_map: TensorMap, dims: InferenceDims, stream: Stream,
               before: tuple[DeviceWork, ...]) -> bool:
        """:meth:`prepare` then :meth:`execute` of a step whose graph, with the same ``before``, the last
        ``execute`` replayed (a steady step): its views are set again where they changed and its graph is
        launched. False, having done nothing, where it is not such a step (then prepare and execute it)."""
        plan = self._plan
        if plan is None or self._closed or plan.graph_before is not before or not plan.graph or \
                not self.graphs_enabled:
            return False
        key = plan.key
        if key[1] is not dims or key[0] != profile or key[2] != id(tensor_map) or key[3] != tensor_map.generation:
            return False
        if stream._closed:
            stream._check_open()
        self._launch(plan, stream, before)
        for t in plan.outputs:
            t._last_stream = stream
        return True

    def replay_again(self, stream: Stream, before: tuple[DeviceWork, ...]) -> bool:
        """:meth:`replay` of the step the last one replayed, where the caller's checks stand for the step's key
        (the same profile, dims and tensor map: ``before`` is work only that step runs, and nothing prepared
        another step since) and ``stream`` is the stream the last one ran on, open (its outputs' last stream
        stays): its views are set again where they changed and its graph is launched. False, having done
        nothing, where the last step replayed was not that one (then :meth:`replay`)."""
        plan = self._plan
        if plan is None or plan.graph_before is not before or not plan.graph or self._closed or \
                not self.graphs_enabled:
            return False
        self._launch(plan, stream, before)
        return True

    def _launch(self, plan: _Plan, stream: Stream, before: tuple[DeviceWork, ...]) -> None:
        """A replay's launch of ``plan``'s graph (checked by the caller) on ``stream``: its views set again where
        they changed, then the graph, which holds its bindings (no context sync)."""
        views = self._views
        if plan.view_changes != views.changes:
            _views_again(plan, views)
        self.enqueued = 0
        self.last_work = before
        self.graph_stats.hits += 1
        graph = plan.graph
        assert graph is not None  # the caller's check
        self._backend.launch_graph(graph, stream._handle)
        self.enqueued = len(before) + 1

    def _enqueue(self, s: Stream, before: tuple[DeviceWork, ...] = ()) -> None:
        for work in before:
            work.enqueue(s)
            self.enqueued += 1
        if not self.context.execute_async_v3(s.handle):
            raise EngineError(f"engine {self.name!r}: execute_async_v3 returned False (profile {self._profile}); "
                              f"see the trtio.trt log for TensorRT's reason")
        self.enqueued += 1

    def _capture(self, key: tuple[tuple[Any, ...], tuple[DeviceWork, ...]], s: Stream) -> int:
        """Warm up, then capture ``before`` and the enqueue as a graph; 0 (plain execution from now on for
        this key: (binding snapshot, before)) where the context says it cannot be captured on ``s``, or where
        the capture fails.

        The warm-up is the step's work: once it has run and the stream has synchronised, the step is done,
        and a capture that fails after that (begin, an enqueue into the capture, end) costs only the graph:
        it is logged, ``graph_stats.last_miss_reason`` says why, and the step returns. A failed warm-up or
        synchronisation raises (the step's work may not have run, or may have failed)."""
        snapshot, before = key
        stats = self.graph_stats
        stats.misses += 1
        stats.last_miss_reason = self._miss_reason(snapshot, before)
        self._last_snapshot, self._last_before = snapshot, before
        self._enqueue(s, before)  # warm-up: TensorRT initialises lazily at new shapes
        s.synchronize()
        capturable = getattr(self.context, "is_stream_capturable", None)
        if capturable is not None and not capturable(s.handle):
            # TensorRT-RTX reports this (e.g. an engine built without REQUIRE_USER_ALLOCATION).
            stats.last_miss_reason += "; not captured: the execution context reports the stream is not capturable"
            self._graphs[key] = 0
            log.info("executor %s: %s", self.name, stats.last_miss_reason)
            return 0
        try:
            graph = self._record(s, before)
        except TrtioError as exc:  # the step ran (the warm-up): only its graph is lost
            stats.last_miss_reason += f"; not captured: {exc}"
            self._graphs[key] = 0
            log.warning("executor %s: the CUDA-graph capture failed after the step ran; this binding snapshot runs "
                        "without a graph from now on (clear_graphs() tries again): %s", self.name, exc)
            return 0
        self._graphs[key] = graph
        stats.captures += 1
        stats.graphs = len(self._graphs)
        log.debug("executor %s: captured graph %d (%s)", self.name, len(self._graphs), stats.last_miss_reason)
        return graph

    def _record(self, s: Stream, before: tuple[DeviceWork, ...]) -> int:
        """Capture ``before`` and the engine's enqueue on ``s`` into a graph; the stream is not left capturing
        whatever fails."""
        be = self._backend
        be.begin_capture(s.handle)
        try:
            for work in before:
                work.enqueue(s)
            ok = self.context.execute_async_v3(s.handle)
        except BaseException:
            be.abort_capture(s.handle)
            raise
        if not ok:
            be.abort_capture(s.handle)
            raise EngineError(f"engine {self.name!r}: execute_async_v3 returned False while capturing a CUDA graph")
        return be.end_capture(s.handle)

    def _miss_reason(self, snapshot: tuple[Any, ...], before: tuple[DeviceWork, ...]) -> str:
        prev = self._last_snapshot
        if prev is None:
            return "first capture"
        if prev == snapshot and before != self._last_before:
            return "other device work before the engine"
        if prev[0] != snapshot[0]:
            return f"profile {prev[0]} -> {snapshot[0]}"
        bound = {name: (addr, shape) for name, addr, shape in prev[1:]}
        for name, addr, shape in snapshot[1:]:
            old = bound.get(name)
            if old is None:
                return f"{name}: newly bound"
            if old[0] != addr:
                return f"{name}: address 0x{old[0]:x} -> 0x{addr:x}"
            if old[1] != shape:
                return f"{name}: shape {_fmt(old[1])} -> {_fmt(shape)}"
        return "binding set changed"

    def clear_graphs(self) -> None:
        """Destroy every captured graph (after a rebinding that makes them stale, or to free them)."""
        try:
            destroy_graphs(self._backend, self._graphs)
        finally:
            for plan in self._plans.values():
                plan.graph = None
                plan.graphs.clear()
            if self._plan is not None:
                self._plan.graph = None
                self._plan.graphs.clear()
            self.graph_stats.graphs = 0

    def unused(self, tensor_map: TensorMap) -> list[str]:
        """Map entries this engine does not declare (bound nowhere, reported instead of silently lost)."""
        declared = set(self.io.names())
        return sorted(n for n in tensor_map.names() if n not in declared)

    def forget(self, tensors: Collection[Tensor]) -> None:
        """Let ``tensors`` go, bound no more (their tensor map rebound their names: a setup's LoRA adapter whose
        device copy is freed, :mod:`trtio.families.lora.adapters`): every plan that binds one of them is dropped,
        every graph captured with their memory bound is destroyed, and this executor stops holding their memory
        (:func:`~trtio._tensor.unmark_bound_memory`), which its owner may then free. A step that binds them again
        (at their addresses or others) plans and captures afresh; the execution context is told its addresses
        again where a plan runs plainly (``_sync``)."""
        self._check_open()
        ids = {id(t) for t in tensors}
        addresses = {t.data_ptr for t in tensors if t.capacity}  # an empty one binds the shared dummy: no graph of it
        for key in [k for k, p in self._plans.items()
                    if any(id(t) in ids for t in p.fixed) or any(id(v[0]) in ids for v in p.all_views)]:
            self._plans.pop(key).dropped = True
        if self._plan is not None and self._plan.dropped:
            self._plan = None
        if self._stable_of is not None and self._stable_of.dropped:
            self._stable_of = None  # unknown: the next plan sets all its views
        if self._synced is not None and self._synced.dropped:
            self._synced = None
        stale = {k: g for k, g in self._graphs.items() if any(a in addresses for _n, a, _s in k[0][1:])}
        for k in stale:
            del self._graphs[k]
        self.graph_stats.graphs = len(self._graphs)
        for t in tensors:
            unmark_bound_memory(t, self)
        destroy_graphs(self._backend, stale)

    # -- lifetime ---------------------------------------------------------------------------------
    def _close_owned(self) -> None:
        # Graphs first, then the context, then the memory they ran in; a failure to destroy or free raises
        # after everything else was released.
        with contextlib.ExitStack() as release:
            if self._own_memory:
                release.callback(self.context_memory.close)
            if self._dummy is not None:
                release.callback(self._dummy.close)
            self.context = None
            self.clear_graphs()

    def __repr__(self) -> str:
        return f"EngineExecutor({self.name!r}, {len(self.io.tensors)} I/O tensors, profile={self._profile})"
