"""A strict double of Phi-4-multimodal's vision encoder (``visual/visual.engine`` of a ``phi4mm`` directory).

:class:`ReferencePhi4mmEngine` declares exactly the I/O Edge-LLM's builder gives the graph
(:func:`trtio.components.visual.phi4mm.phi4mm_registry`: ``input`` float16 ``[blocks, 3, crop, crop]`` with its one
profile, ``output`` float16 ``[blocks * 256, hidden]``) and, like :class:`~trtio.testing.ReferenceEngine`, checks
every shape and address it is given and computes on the raw memory (numpy on the host device). Its computation is
a stand-in in which every input value and every block's place count: token ``(r, c)`` of a block is the mean of
the block's ``crop / 16``-pixel square ``(r, c)`` per channel, times a seeded ``[3, hidden]`` matrix, plus a seeded
row of its place ``r * 16 + c`` (:func:`reference_phi4mm`).
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from trtio.components.visual.phi4mm import Phi4mmVisualConfig, kVisualInput, kVisualOutput, phi4mm_registry
from trtio.errors import ConfigError, InvalidValueError
from trtio.testing.reference_engine import ReferenceExecutionContext, _Plan
from trtio.testing.reference_io import ExecutionContextAllocationStrategy, TensorIOMode, _Decl
from trtio.testing.reference_visual import EncoderReferenceEngine

__all__ = ["ReferencePhi4mmEngine", "reference_phi4mm"]


class _Geometry:
    """What :class:`ReferenceExecutionContext`'s shared checks read of an engine's geometry."""

    is_ragged: bool = False
    is_spec: bool = False
    role: str = "visual"
    contract: str = "visual"
    types: tuple[str, ...] = ()


def _weights(cfg: Phi4mmVisualConfig, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((cfg.in_channels, cfg.out_hidden_size)).astype(np.float32),
            rng.standard_normal((cfg.tokens_per_block, cfg.out_hidden_size)).astype(np.float32))


def reference_phi4mm(cfg: Phi4mmVisualConfig, blocks: Any, seed: int = 0) -> np.ndarray:
    """The double's output for ``blocks`` (``[n, 3, crop, crop]``): float16 ``[n * 256, hidden]`` (module
    docstring)."""
    x = np.asarray(blocks, np.float32)
    n, c, s = x.shape[0], cfg.in_channels, cfg.crop_size
    t = cfg.tokens_per_side
    pooled = x.reshape(n, c, t, s // t, t, s // t).mean(axis=(3, 5))  # [n, c, t, t]
    w, place = _weights(cfg, seed)
    tokens = pooled.transpose(0, 2, 3, 1).reshape(n, t * t, c) @ w + place[None]
    out: np.ndarray = tokens.reshape(n * t * t, cfg.out_hidden_size).astype(np.float16)
    return out


class ReferencePhi4mmEngine(EncoderReferenceEngine):
    """The double (module docstring); build it with :meth:`from_config`. Host device only."""

    def __init__(self, cfg: Phi4mmVisualConfig, *, name: str, seed: int, backend: Any) -> None:
        self._cfg = cfg
        self._geo = _Geometry()  # type: ignore[assignment]
        self._backend = backend
        self._device = "host"
        self._null_compute = False
        self._name = name
        self._seed = seed
        self._tp = (0, 1)
        self._all_reduce = None
        self._weight_inputs = ()
        self._decls = [_Decl(i, s.name, TensorIOMode.INPUT if s.is_input else TensorIOMode.OUTPUT, s.dtype,
                             s.engine_shape, s.profiles if s.is_input else ())
                       for i, s in enumerate(phi4mm_registry(cfg))]
        self._by_name = {decl.name: decl for decl in self._decls}
        self._host_weights = None
        self._gpu_weights = None
        self._device_id = -1
        self._context_ids = itertools.count()
        self._profile_memory = (512,)

    @classmethod
    def from_config(cls, cfg: Any, *, seed: int = 0, name: str | None = None, backend: Any = None,
                    **unused: Any) -> ReferencePhi4mmEngine:
        """The double of ``cfg`` (a Phi4mmVisualConfig). ``backend``: a host-kind Backend instance (an
        :class:`~trtio.testing.AsyncHostBackend`) to launch on, None for the shared host backend."""
        if not isinstance(cfg, Phi4mmVisualConfig):
            raise ConfigError("cfg", f"ReferencePhi4mmEngine takes a Phi4mmVisualConfig, got {type(cfg).__name__}")
        if unused:
            raise InvalidValueError(f"ReferencePhi4mmEngine.from_config: {sorted(unused)} are for LLM engines")
        return cls(cfg, name=name or "toy-phi4mm-vit", seed=seed, backend=backend)

    def _context(self, strategy: ExecutionContextAllocationStrategy, name: str) -> ReferencePhi4mmContext:
        return ReferencePhi4mmContext(self, strategy, name)


    def __repr__(self) -> str:
        return f"ReferencePhi4mmEngine(name={self._name!r}, io_tensors={len(self._decls)})"


class ReferencePhi4mmContext(ReferenceExecutionContext):
    """The double's ``IExecutionContext``: the parent's profile, shape, address and memory handling, with the
    output's shape (256 rows a block) and the stand-in computation."""

    _engine: ReferencePhi4mmEngine

    def get_tensor_shape(self, name: str) -> tuple[int, ...]:
        decl = self._engine._by_name.get(name)
        if decl is None or decl.is_input:
            return super().get_tensor_shape(name)
        blocks = self._shapes.get(kVisualInput)
        cfg = self._engine._cfg
        return (-1, cfg.out_hidden_size) if blocks is None else (blocks[0] * cfg.tokens_per_block,
                                                                 cfg.out_hidden_size)

    def _shape_problems(self) -> list[str]:
        return []  # one input: its shape is checked against the profile when it is set

    def _compute_host(self, plan: _Plan, stream: int) -> None:
        engine = self._engine
        plan.views[kVisualOutput][...] = reference_phi4mm(engine._cfg, plan.views[kVisualInput], engine._seed)
