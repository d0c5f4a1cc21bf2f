"""What every component's encoder setup is: one encoder engine (a ViT, an audio encoder) bound to its worst-case
buffers.

:class:`EncoderSetup` checks the engine's declared I/O against the component's registry (names, dtypes, ranks,
fixed dims, the one optimization profile Edge-LLM's encoder engines have, each profile's range covering the
registry's), allocates the requested buffers in one arena, builds the frozen tensor map and the executor, and owns
them; a component's setup (``VisualSetup``, ``InternVLSetup``, ``AudioSetup``) is one, adding its own staging and
``encode``. Its views: ``cfg``, ``executor``, ``tensor_map``, ``registry``, ``graph_stats``, ``backend``,
``memory_report()``. Follows trtio's close protocol.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

from trtio._cuda.backend import Backend
from trtio._engine import EngineExecutor
from trtio._lifetime import Closeable
from trtio._memory import Arena, MemoryReport, TensorRequest
from trtio._registry import TensorRegistry
from trtio._setups.binding import declared_problems, engine_backend, engine_io, profile_problems
from trtio._setups.calls import Calls
from trtio._stream import StreamLike, as_stream
from trtio._tensor_map import TensorMap
from trtio.errors import BindingError

__all__ = ["EncoderSetup"]


class EncoderSetup(Closeable):
    """An encoder engine bound to its worst-case buffers (module docstring). A subclass's ``__init__`` checks its
    config, builds its registry and requests, and calls :meth:`_bind`."""

    cfg: Any
    registry: TensorRegistry
    tensor_map: TensorMap
    executor: EngineExecutor
    #: The factory that builds the setup: the call named in errors and memory reports.
    FACTORY = ""
    #: What the engine encodes, in messages ("visual", "audio").
    WHAT = ""

    def _bind(self, engine: Any, registry: TensorRegistry, requests: Sequence[TensorRequest], stream: StreamLike,
              *, graphs: bool, backend: Backend | str | None,
              staging: Callable[[contextlib.ExitStack, Arena, Backend], None] = lambda stack, arena, be: None) -> None:
        """Check ``engine`` against ``registry``, then allocate ``requests`` in one arena, build the tensor map of
        the registry's bindings and the executor; ``staging(stack, arena, backend)`` makes the subclass's own
        staging (entered on ``stack``: closed with the setup, or at once where a later step fails)."""
        eio = engine_io(engine, self.FACTORY)
        problems = declared_problems(eio, registry)
        for info in eio.inputs:
            spec = registry.get(info.name)
            if spec is not None and info.profiles and spec.profiles and len(spec.shape) == len(info.shape):
                problems += profile_problems(info, spec, lower=True)
        if eio.num_profiles != 1:
            problems.append(f"the engine has {eio.num_profiles} optimization profiles; Edge-LLM's {self.WHAT} "
                            f"engines have one")
        if problems:
            raise BindingError(eio.name, problems)
        be = engine_backend(engine, backend)
        self._backend = be
        self.registry = registry
        self._init_lifetime(f"{self.WHAT} setup {eio.name!r}")
        s = as_stream(stream, be)
        with contextlib.ExitStack() as stack:
            self._arena = stack.enter_context(Arena(requests, backend=be, title=self.WHAT))
            staging(stack, self._arena, be)
            self._calls = stack.enter_context(Calls(be, type(self).__name__))
            tm = TensorMap(self.WHAT)
            for spec in registry:
                tm.add(spec.name, self._arena[spec.name])
            tm.freeze()
            self.tensor_map = tm
            self.executor = stack.enter_context(EngineExecutor(engine, name=eio.name, registry=registry,
                                                               graphs=graphs, backend=be))
            tm.add_user(self.executor)
            s.synchronize()
            self._resources: contextlib.ExitStack | None = stack.pop_all()

    # -- views ---------------------------------------------------------------------------------------
    @property
    def graph_stats(self) -> Any:
        """The executor's CUDA-graph telemetry (hits, captures, misses, last miss reason)."""
        return self.executor.graph_stats

    @property
    def backend(self) -> Backend:
        return self._backend

    def memory_report(self) -> MemoryReport:
        """Every buffer the setup owns (the arena and the executor's context memory)."""
        self._check_open()
        return MemoryReport.combine(self.FACTORY, [self._arena.report(), self.executor.context_memory.report()])

    def _close_owned(self) -> None:
        resources, self._resources = self._resources, None
        if resources is not None:
            resources.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.cfg.model_type}, graphs={self.executor.graphs_enabled})"
