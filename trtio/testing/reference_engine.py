"""A pure-Python stand-in for a TensorRT engine that computes trtio's toy transformer.

:class:`ReferenceEngine` implements the subset of TensorRT 10/11's ``ICudaEngine`` and
``IExecutionContext`` Python API that trtio uses, with TensorRT's names, argument orders, return
types and failure behaviour, and computes the toy model of ``docs/toy-model.md`` on the raw
addresses it is given. trtio talks to it exactly as to TensorRT; nothing in trtio special-cases it.
The enums TensorRT's API returns (:class:`DataType`, :class:`TensorIOMode`, :class:`TensorLocation`,
:class:`ExecutionContextAllocationStrategy`) are attributes of this module, because trtio finds them
through ``sys.modules[type(engine).__module__]``.

This module is the TensorRT API emulation; its parts live beside it: ``reference_io`` (the enums, the
engine's geometry and declared I/O), ``reference_math`` (one engine call over numpy or CuPy: both
contracts prepare their views of a step and share one layer loop) and ``reference_gpu`` (CuPy on raw
device memory: the scratch allocator, the kernels, the context-memory bound).

Two contracts, picked by ``cfg.contract``: trtio's batch-major one (``[B, S, H]`` activations,
contiguous KV caches written like TensorRT's KVCacheUpdate) and, for ``"ragged"``, Edge-LLM 0.11's
token-major one (``[T, H]`` entry-padded rows, phase carriers, one paged KV pool per layer read and
written through ``kv_page_table``; fp8 pools included). Its I/O is built from
``trtio._contracts.ragged.registry_for`` and ``trtio._state.paged_state_specs``, in the order NVIDIA's
exporter writes it. ``docs/toy-model.md`` specifies both.

Two devices:

* ``"host"``: numpy on host memory (trtio's ``host`` backend). ``execute_async_v3(stream)``
  enqueues one closure with the host backend's ``launch_host_func``; the closure holds the
  bindings (addresses and shapes) as they were at enqueue time and computes on the raw memory in
  place (no copies of the caches). While the stream is captured the closure is recorded, and every
  replay of the host "graph" recomputes from the same addresses with whatever data they then hold,
  as a CUDA graph would.
* ``"gpu"``: CuPy on device memory, on the given stream (``cupy.cuda.Stream.from_external``).
  Every temporary CuPy makes comes from a per-context bump allocator over the context memory, reset at
  the start of each execute (and after each layer), so an execute hands out the same addresses each
  time, never calls ``cudaMalloc`` and never synchronises the host: after one warm-up execute with the
  same bindings, ``execute_async_v3`` can be captured into a CUDA graph.

Where this engine chooses behaviour TensorRT leaves open or undefined:

* ``execute_async_v3`` returns False (logging each reason) for: an I/O without an address, a
  dynamic input without a shape, a ``present_*`` output not bound to its cache's address, a cache
  batch other than ``inputs_embeds``' (KVCacheUpdate), input shapes that disagree on the batch or
  step length (TensorRT's shape inference would refuse them), and USER_MANAGED context memory that
  is missing or smaller than the active profile needs. Ragged: ``T`` not a multiple of ``S``
  (``query_lengths``' extent), ``[S]`` inputs, ``kv_page_table`` rows or ``query_start_offsets``
  (``S + 1``) of another extent, token inputs of other than ``T`` rows, a phase extent outside 1..5
  (4..5 need a ``packed_attention_mask`` of ``ceil(W / 32)`` words or more), a context-sequence
  carrier other than ``S`` in phases 1-2 or 0 in phases 3-5.
* Switching to another optimization profile forgets every input shape: set them again.
* Data that would index outside a tensor (a cache slot ``start + s >= C``, a RoPE position
  ``>= C``, a ``last_token_ids`` entry ``>= S``) raises :class:`~trtio.InvalidValueError` on the host
  device, from the enqueued work; on the GPU it is clipped, since checking would synchronise the host.
  Ragged: an offset other than ``i * W``, a query length outside ``0..W``, a slot past the sequence's
  pages, a logits row outside ``T``, in tree phases an ``attention_sequence_lengths`` entry below ``W``
  (the GPU ignores the offsets and clips the rest); and a page id the step touches that is unmapped
  (-1) or outside the pool (``0 .. 2P - 1``): the host raises, and on the GPU that sequence writes no
  K/V and every row of its outputs (logits, hidden states) is NaN, computed on the device, so a
  page-table bug fails any comparison of logits instead of passing silently. Entries of pages a step
  never touches are not read.
* ``device_memory_size_v2`` is the GPU scratch bound of the worst-case shapes of either profile
  (reported on the host device too, where nothing uses it); a ``null_compute`` engine reports 512.
* Where TensorRT's Python API raises (an unknown allocation strategy, a profile index out of range,
  ``set_device_memory`` on a context that does not take it), this engine raises a
  :class:`~trtio.TrtioError` (:class:`~trtio.InvalidValueError`, :class:`~trtio.UnknownNameError` or
  :class:`~trtio.EngineError`) with the message TensorRT's failure would carry.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from trtio import names
from trtio._checkpoint import BINDINGS_KEY, parse_bindings
from trtio._checks import is_int
from trtio._cuda._hostmem import host_view
from trtio._cuda.backend import Backend
from trtio._dtypes import DType
from trtio.errors import ConfigError, EngineError, InvalidValueError, UnknownNameError
from trtio.testing.reference_dflash import forward_dflash
from trtio.testing.reference_gemma4 import Gemma4Weights, gemma4_forward
from trtio.testing.reference_gpu import (
    ADDRESS_ALIGNMENT,
    _BumpAllocator,
    _GpuMatmul,
    _GpuScatterRows,
    _import_cupy,
    _ragged_scratch_bound,
    _scratch_bound,
    compute_device,
    gpu_scope,
)
from trtio.testing.reference_io import (
    _RAGGED_UNREAD,
    RAGGED_OMITTABLE,
    DataType,
    ExecutionContextAllocationStrategy,
    Shape,
    TensorIOMode,
    TensorLocation,
    _batch_shape_problems,
    _Decl,
    _declare,
    _declare_ragged,
    _Geometry,
    _index,
    _ragged_shape_problems,
)
from trtio.testing.reference_lora import lora_declarations, lora_pairs
from trtio.testing.reference_math import (
    _DataError,
    _forward,
    _forward_ragged,
    _load,
    _NoScratch,
    _scatter_rows_host,
    _Weights,
    e4m3fn_bits_to_float32,
    float32_to_e4m3fn_bits,
)
from trtio.testing.reference_tp import AllReduce, rank_weights
from trtio.testing.toy_model import ToyWeights

__all__ = [
    "ADDRESS_ALIGNMENT",
    "RAGGED_OMITTABLE",
    "DataType",
    "ExecutionContextAllocationStrategy",
    "IOIndexError",
    "ReferenceEngine",
    "ReferenceExecutionContext",
    "TensorIOMode",
    "TensorLocation",
    "e4m3fn_bits_to_float32",
    "float32_to_e4m3fn_bits",
]

log = logging.getLogger("trtio.testing.reference_engine")

#: The context memory a reference engine reports when it needs none (null_compute): never 0.
_MIN_CONTEXT_MEMORY = 512


def _identity(partial: Any) -> Any:
    return partial


class IOIndexError(InvalidValueError, IndexError):
    """``engine[i]`` with an index outside the engine's I/O tensors: an :class:`~trtio.InvalidValueError`,
    and an ``IndexError`` as TensorRT's raises (iterating over an engine stops on it)."""


# -- the engine -------------------------------------------------------------------------------------


def _engine_device(device: str, backend: Backend | str | None, null_compute: bool) -> str:
    """Where a :class:`ReferenceEngine` computes (``"host"`` or ``"gpu"``): ``device``, which ``backend`` (where
    given) decides and must agree with."""
    if device not in ("auto", "host", "gpu"):
        raise InvalidValueError(f"ReferenceEngine: device must be 'auto', 'host' or 'gpu', got {device!r}")
    if backend is not None:
        if isinstance(backend, str) and backend not in ("host", "cuda"):
            raise InvalidValueError(f"ReferenceEngine: backend must be 'host', 'cuda' or a Backend, got {backend!r}")
        name_of = backend if isinstance(backend, str) else backend.name
        kind = "gpu" if name_of == "cuda" else "host"
        if device not in ("auto", kind):
            raise InvalidValueError(f"ReferenceEngine: device={device!r} disagrees with backend={backend!r} (which "
                                    f"computes on the {kind})")
        device = kind
    return compute_device(device, null_compute, "ReferenceEngine")


class ReferenceEngine:
    """A toy-model engine with TensorRT's ``ICudaEngine`` API (see module docstring).

    Build it with :meth:`from_config`. Unknown tensor names behave as TensorRT's getters do: an
    error is logged on ``trtio.testing.reference_engine`` and a sentinel comes back
    (``get_tensor_mode``: ``TensorIOMode.NONE``; ``get_tensor_dtype``: ``DataType.FLOAT``;
    ``get_tensor_shape``: ``()``; ``get_tensor_location``: ``TensorLocation.DEVICE``;
    ``get_aliased_input_tensor``: None); ``get_tensor_profile_shape`` raises where TensorRT's Python
    binding does: :class:`~trtio.UnknownNameError` for an unknown name, :class:`~trtio.InvalidValueError`
    for an output or a profile out of range.
    """

    def __init__(self, cfg: Any, weights: ToyWeights, *, device: str, null_compute: bool, name: str,
                 seed: int, fixed_cache_batch: bool = False, omit: Iterable[str] = (), tp_rank: int = 0,
                 tp_size: int = 1, all_reduce: AllReduce | None = None,
                 weight_inputs: Sequence[tuple[str, DType, Shape]] = (), backend: Backend | str | None = None,
                 lora_naming: str = "modules") -> None:
        self._cfg = cfg
        self._backend = backend if backend is not None and not isinstance(backend, str) else None
        self._geo = _Geometry.from_config(cfg, fixed_cache_batch=fixed_cache_batch)
        self._toy_weights = weights
        self._device = device
        self._null_compute = bool(null_compute)
        self._name = name
        self._seed = seed
        self._tp = (tp_rank, tp_size)
        self._all_reduce = all_reduce
        self._weight_inputs = tuple(name for name, _, _ in weight_inputs)
        if tp_size > 1 and not self._null_compute:
            weights = rank_weights(weights, tp_rank, tp_size, self._geo.hq, self._geo.hkv, self._geo.d)
        self._decls = _declare_ragged(cfg, omit, weight_inputs) if self._geo.is_ragged else _declare(self._geo)
        # LoRA engines (reference_lora): declared after every input; a null-compute engine declares a real
        # engine's modules (dry runs size their buffers), a computing one the toy's
        lora = lora_declarations(cfg, lora_naming, "edgellm" if null_compute else "toy")
        self._lora = bool(lora) and lora_naming == "modules" and not null_compute
        self._decls += [_Decl(len(self._decls) + i, name, TensorIOMode.INPUT, dtype, shape, profiles)
                        for i, (name, dtype, shape, profiles) in enumerate(lora)]
        self._by_name = {decl.name: decl for decl in self._decls}
        self._host_weights: _Weights | None = None
        self._gpu_weights: _Weights | None = None
        self._gpu_matmul: _GpuMatmul | None = None
        self._gpu_scatter: _GpuScatterRows | None = None
        self._device_id = -1
        self._context_ids = itertools.count()
        # Gemma 4 (trtio.testing.reference_gemma4): per-layer geometry, its own weights (CuPy arrays on the GPU).
        self._gemma4: Gemma4Weights | None = None
        if getattr(cfg, "gemma4", None) is not None and not self._null_compute:
            self._gemma4 = Gemma4Weights.generate(cfg, seed)
        if device == "gpu" and not self._null_compute:
            cupy = _import_cupy()
            self._device_id = int(cupy.cuda.runtime.getDevice())
            if self._gemma4 is not None:
                self._gemma4 = self._gemma4.to(cupy.asarray)
            self._gpu_weights = _Weights.of(weights, cupy.asarray)
            self._gpu_matmul = _GpuMatmul(cupy)
            if self._geo.is_ragged:
                self._gpu_scatter = _GpuScatterRows(cupy)
        elif not self._null_compute:
            self._host_weights = _Weights.of(weights, np.asarray)
        sizes = []
        for p in range(2):
            g = self._geo
            if self._null_compute:
                sizes.append(_MIN_CONTEXT_MEMORY)
            elif g.is_ragged:
                steps = g.smax if p == 0 else g.p1  # rows per sequence: a prompt, or a generation step
                select = g.bmax * steps if g.is_spec else g.bmax  # logits rows (profile max)
                sizes.append(_ragged_scratch_bound(_gemma4_geometry(g, cfg), g.bmax * steps, g.bmax, select))
            else:
                seq = g.smax if p == 0 else g.p1
                select = 1 if p == 0 else g.p1
                sizes.append(_scratch_bound(g, g.bmax, seq, select))
        if self._lora:  # each layer's x @ A and (x @ A) @ B beside its own temporaries: within twice the bound
            sizes = [2 * size for size in sizes]
        self._profile_memory = tuple(sizes)

    @classmethod
    def from_config(cls, cfg: Any, *, seed: int = 0, device: str = "auto", weights: ToyWeights | None = None,
                    null_compute: bool = False, name: str | None = None,
                    fixed_cache_batch: bool = False, omit: Iterable[str] = (), tp_rank: int = 0, tp_size: int = 1,
                    all_reduce: AllReduce | None = None, backend: Backend | str | None = None,
                    lora_naming: str = "modules") -> ReferenceEngine:
        """An engine computing the toy model of ``cfg`` (an ``LLMEngineConfig`` or any object with its fields).

        ``cfg.contract`` picks the I/O contract: ``"ragged"`` is Edge-LLM 0.11's token-major one with
        a paged KV cache (``docs/toy-model.md``; it needs the config's ragged fields:
        ``kv_page_size``, ``kv_pool_pages``, ``pages_per_sequence``, ``eagle_hidden_state_layers``,
        ``role``, ``max_step_tokens``); anything else (None included) the batch-major one.
        ``omit`` (ragged only) leaves out optional inputs no dense graph reads
        (:data:`RAGGED_OMITTABLE`), as an engine whose ONNX parser dropped them; a name this role
        does not declare as optional is an :class:`~trtio.InvalidValueError`. Ragged engines take
        ``kv_cache_dtype="fp8"`` (e4m3fn pools); batch ones compute with float32, float16 or bfloat16 caches
        only.

        ``fixed_cache_batch=True`` declares the batch-contract caches with a fixed batch of
        ``max_supported_batch_size`` (cache rows are sequence slots; a step of ``b`` sequences uses
        rows ``0..b-1``) instead of a dynamic one that must equal the step's batch.

        ``weights`` default to ``ToyWeights.generate(cfg, seed)``. ``device``: ``"host"`` (numpy,
        for trtio's host backend), ``"gpu"`` (CuPy, for the cuda backend), or ``"auto"`` (gpu when
        ``trtio._cuda.backend.cuda_available()`` and CuPy imports, else host). ``null_compute=True`` keeps the
        I/O contract and every validation but computes nothing (overhead benchmarks); it needs no
        weights and reports a small context memory. ``name`` defaults to ``"toy-<role>"``.

        ``backend``: the trtio backend the engine computes on and launches its work on (a ``Backend``
        instance, e.g. :class:`~trtio.testing.AsyncHostBackend`, or ``"host"`` / ``"cuda"``); its kind sets
        ``device`` (a ``device`` that disagrees is refused). Setups bind the engine on it
        (:attr:`trtio_backend`). Default: the shared backend of ``device``.

        Tensor parallelism (ragged only; ``trtio.testing.reference_tp``): ``tp_rank`` of ``tp_size`` ranks
        computes its share of the model (``cfg`` is the rank's config: its heads and KV heads; ``weights`` are
        the whole model's, required when ``tp_size > 1``) and sums the attention and MLP outputs over the ranks
        with ``all_reduce`` (where given, also for one rank; required when ``tp_size > 1``). A rank's config
        (``EngineDir.rank_config``: its ``extras`` name ``tp_rank``) whose ``extras`` list
        ``checkpoint_weight_bindings`` gets one static input per binding, read at each execute:
        ``lm_head.weight`` ``[vocab, hidden]`` (the LM head, transposed) and
        ``model.layers.<i>.mlp.down_proj.weight`` ``[hidden, MLP width]`` (layer i's ``w2``, transposed: the
        rank's rows); a null-compute engine declares any binding.

        LoRA (``cfg.max_lora_rank > 0``, ragged only; ``trtio.testing.reference_lora``): every linear layer of the
        attention layers takes ``{module}.lora_A.weight`` / ``lora_B.weight`` (rank 0 .. max) and adds
        ``x @ A @ B``. ``lora_naming="nodes"`` names those inputs after graph nodes (``ode_linear_N``), as
        Edge-LLM 0.11's ``insert-lora`` does on an export with anonymous weights (trtio binds them at rank 0 and
        refuses an adapter; the engine computes no LoRA).
        """
        validate = getattr(cfg, "validate", None)
        if callable(validate):
            validate()
        device = _engine_device(device, backend, null_compute)
        geo = _Geometry.from_config(cfg)
        omit = tuple(omit)
        if geo.is_ragged and fixed_cache_batch:
            raise InvalidValueError("ReferenceEngine: fixed_cache_batch is for the batch contract; a ragged "
                                    "engine's KV state is a paged pool")
        if omit and not geo.is_ragged:
            raise InvalidValueError(f"ReferenceEngine: omit={list(omit)} is for the ragged contract (cfg.contract="
                                    f"'ragged'); a batch engine has no optional inputs")
        if not null_compute:
            floats = (DType.FLOAT32, DType.FLOAT16, DType.BFLOAT16)
            for field_name, dt in (("activation_dtype", geo.act), ("kv_cache_dtype", geo.kv)):
                if dt in floats or (geo.is_ragged and field_name == "kv_cache_dtype" and dt is DType.FP8):
                    continue
                also = " (fp8 KV: ragged contract only)" if dt is DType.FP8 else ""
                raise ConfigError(field_name, f"ReferenceEngine computes with float32, float16 or bfloat16 only{also}, "
                                              f"got {dt} (pass null_compute=True for an engine that only checks its "
                                              f"I/O)")
        if not is_int(tp_size) or tp_size < 1 or not is_int(tp_rank) or not 0 <= tp_rank < tp_size:
            raise InvalidValueError(f"ReferenceEngine: tp_rank {tp_rank!r} of tp_size {tp_size!r}: expected ranks "
                                    "0 .. tp_size - 1 of tp_size >= 1")
        if (tp_size > 1 or all_reduce is not None) and not geo.is_ragged:
            raise InvalidValueError("ReferenceEngine: tensor parallelism is for the ragged contract (Edge-LLM "
                                    "0.11's tensor-parallel LLM engines)")
        if int(getattr(cfg, "max_lora_rank", 0) or 0) and (not geo.is_ragged or tp_size > 1 or geo.types):
            raise InvalidValueError("ReferenceEngine: LoRA (max_lora_rank > 0) is for a dense ragged engine of one "
                                    "rank")
        if tp_size > 1 and not null_compute and (weights is None or all_reduce is None):
            raise InvalidValueError(f"ReferenceEngine: rank {tp_rank} of {tp_size} needs the whole model's weights "
                                    "(weights=) and the ranks' all-reduce (all_reduce=)")
        if weights is None:
            weights = ToyWeights.generate(cfg, seed) if not null_compute else _NO_WEIGHTS
        elif weights.num_layers != geo.layers or weights.is_draft != (geo.role == "draft"):
            raise InvalidValueError(f"ReferenceEngine: the weights ({weights.num_layers} layers, draft="
                                    f"{weights.is_draft}) do not fit the config ({geo.layers} layers, role "
                                    f"{geo.role!r})")
        return cls(cfg, weights, device=device, null_compute=null_compute, backend=backend,
                   name=name if name is not None else f"toy-{geo.role}", seed=seed,
                   fixed_cache_batch=fixed_cache_batch, omit=omit, tp_rank=int(tp_rank), tp_size=int(tp_size),
                   all_reduce=all_reduce, weight_inputs=_weight_inputs(cfg, geo, int(tp_size), null_compute),
                   lora_naming=lora_naming)

    # -- reference-engine extras (not TensorRT API) ---------------------------------------------
    @property
    def config(self) -> Any:
        return self._cfg

    @property
    def weights(self) -> ToyWeights:
        return self._toy_weights

    @property
    def device(self) -> str:
        """``"host"`` or ``"gpu"``: where this engine computes."""
        return self._device

    @property
    def trtio_backend(self) -> Backend | str:
        """The trtio backend whose memory this engine computes on and whose streams it launches on: the one
        ``from_config`` was given, else ``"host"`` or ``"cuda"``."""
        if self._backend is not None:
            return self._backend
        return "cuda" if self._device == "gpu" else "host"

    @property
    def null_compute(self) -> bool:
        return self._null_compute

    @property
    def tp_rank(self) -> int:
        """The tensor-parallel rank this engine computes (0 of 1: the whole model)."""
        return self._tp[0]

    @property
    def tp_size(self) -> int:
        return self._tp[1]

    @property
    def contract(self) -> str:
        """``"batch"`` or ``"ragged"``: the I/O contract this engine speaks."""
        return self._geo.contract

    def io_contract(self) -> list[dict[str, Any]]:
        """The I/O contract as ``trtio.testing.toy_build.network_contract`` reports a built network's."""
        rows = []
        for decl in self._decls:
            rows.append(dict(name=decl.name, mode="input" if decl.is_input else "output", dtype=str(decl.dtype),
                             shape=decl.shape, profiles=list(decl.profiles), aliased_input=decl.alias))
        return rows

    def __repr__(self) -> str:
        return (f"ReferenceEngine(name={self._name!r}, role={self._geo.role!r}, contract={self._geo.contract!r}, "
                f"device={self._device!r}, io_tensors={len(self._decls)}, null_compute={self._null_compute})")

    def _bound_weights(self, xp: Any, weights: _Weights, views: Mapping[str, Any]) -> _Weights:
        """``weights`` with those the engine reads from its weight inputs taken from the bound memory."""
        if self._lora:
            weights = dataclasses.replace(weights, lora=lora_pairs(self._cfg, lambda v: _load(xp, v, DType.FLOAT16),
                                                                   views))
        if not self._weight_inputs:
            return weights
        w2 = list(weights.w2)
        w_lm = weights.w_lm
        dtypes = {d.name: d.dtype for d in self._decls}
        for name in self._weight_inputs:
            value = _load(xp, views[name], dtypes[name]).T  # [out, in] as stored -> x @ w
            if name == _LM_HEAD_INPUT:
                w_lm = value
            else:
                layer = _DOWN_PROJ_INPUT.fullmatch(name)
                assert layer is not None
                w2[int(layer.group(1))] = value
        return dataclasses.replace(weights, w2=tuple(w2), w_lm=w_lm)

    def _all_reduce_on(self, xp: Any, stream: int) -> Callable[[Any], Any]:
        """The layer loop's all-reduce for an execute on ``stream`` (the identity without ``all_reduce``)."""
        reduce = self._all_reduce
        if reduce is None:
            return _identity
        return lambda partial: reduce(xp, partial, stream)

    # -- ICudaEngine -------------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self._name

    @property
    def num_io_tensors(self) -> int:
        return len(self._decls)

    @property
    def num_optimization_profiles(self) -> int:
        return 2

    def __len__(self) -> int:
        return len(self._decls)

    def __getitem__(self, index: int) -> str:
        i = _index(index, len(self._decls))
        if i is None:
            raise IOIndexError(f"{self._name}: I/O tensor index {index!r} out of range [0, {len(self._decls)})")
        return self._decls[i].name

    def get_tensor_name(self, index: int) -> str | None:
        i = _index(index, len(self._decls))
        if i is None:
            log.error("%s: get_tensor_name: index %r is out of range [0, %d)", self._name, index, len(self._decls))
            return None
        return self._decls[i].name

    def _lookup(self, call: str, name: str) -> _Decl | None:
        decl = self._by_name.get(name)
        if decl is None:
            log.error("%s: %s: %r is not an I/O tensor of this engine", self._name, call, name)
        return decl

    def get_tensor_mode(self, name: str) -> TensorIOMode:
        decl = self._lookup("get_tensor_mode", name)
        return TensorIOMode.NONE if decl is None else decl.mode

    def get_tensor_dtype(self, name: str) -> DataType:
        decl = self._lookup("get_tensor_dtype", name)
        return DataType.FLOAT if decl is None else DataType[decl.dtype.trt_name]

    def get_tensor_shape(self, name: str) -> tuple[int, ...]:
        decl = self._lookup("get_tensor_shape", name)
        return () if decl is None else decl.shape

    def get_tensor_location(self, name: str) -> TensorLocation:
        self._lookup("get_tensor_location", name)
        return TensorLocation.DEVICE

    def is_shape_inference_io(self, name: str) -> bool:
        self._lookup("is_shape_inference_io", name)
        return False

    def get_tensor_profile_shape(self, name: str, profile_index: int) -> list[tuple[int, ...]]:
        """``[min, opt, max]`` of input ``name`` in ``profile_index`` (a static input: its shape thrice)."""
        decl = self._by_name.get(name)
        if decl is None:
            raise UnknownNameError(f"{self._name}: get_tensor_profile_shape: {name!r} is not an I/O tensor")
        if not decl.is_input:
            raise InvalidValueError(f"{self._name}: get_tensor_profile_shape: {name!r} is an output, not an input")
        p = _index(profile_index, 2)
        if p is None:
            raise InvalidValueError(f"{self._name}: get_tensor_profile_shape: profile index {profile_index!r} "
                                    f"is out of range [0, 2)")
        return list(decl.profiles[p])

    def get_aliased_input_tensor(self, name: str) -> str | None:
        decl = self._lookup("get_aliased_input_tensor", name)
        return None if decl is None else decl.alias

    @property
    def device_memory_size_v2(self) -> int:
        """Context memory (bytes) that covers every profile."""
        return max(self._profile_memory)

    def get_device_memory_size_for_profile_v2(self, profile_index: int) -> int:
        p = _index(profile_index, 2)
        if p is None:
            log.error("%s: get_device_memory_size_for_profile_v2: profile index %r is out of range [0, 2)",
                      self._name, profile_index)
            return 0
        return self._profile_memory[p]

    def create_execution_context(
        self, strategy: ExecutionContextAllocationStrategy | int = ExecutionContextAllocationStrategy.STATIC,
    ) -> ReferenceExecutionContext:
        """A new context. STATIC and ON_PROFILE_CHANGE own context memory of ``device_memory_size_v2``
        bytes (allocated on the GPU now; the host device needs none); USER_MANAGED waits for
        ``set_device_memory``."""
        try:
            strategy = ExecutionContextAllocationStrategy(int(strategy))
        except (TypeError, ValueError):
            raise InvalidValueError(f"{self._name}: create_execution_context: unknown allocation strategy "
                                    f"{strategy!r}") from None
        return ReferenceExecutionContext(self, strategy, f"{self._name}.context{next(self._context_ids)}")


_NO_WEIGHTS = ToyWeights(wq=(), wk=(), wv=(), wo=(), w1=(), w2=(), we=None, wh=None, wd=None,
                         w_lm=np.zeros((0, 0), np.float32))
_LM_HEAD_INPUT = "lm_head.weight"
_DOWN_PROJ_INPUT = re.compile(r"model\.layers\.(\d+)\.mlp\.down_proj\.weight")
_BINDING_DTYPES = {"F16": DType.FLOAT16, "F32": DType.FLOAT32, "BF16": DType.BFLOAT16}


def _gemma4_geometry(g: _Geometry, cfg: Any) -> _Geometry:
    """The geometry whose scratch bound covers a Gemma 4 step (``reference_gemma4``): its largest layer's head dim,
    and four times its most KV heads (the gathered keys and values are repeated to the query heads, each layer
    kind's reads and writes and the donors' K/V are kept for the whole step); ``g`` itself for another model."""
    g4 = getattr(cfg, "gemma4", None)
    if g4 is None:
        return g
    return dataclasses.replace(g, hkv=4 * max(g4.kv_heads), d=max(g4.head_dims))


def _weight_inputs(cfg: Any, geo: _Geometry, tp_size: int, null_compute: bool) -> list[tuple[str, DType, Shape]]:
    """The static weight inputs of ``cfg``'s ``checkpoint_weight_bindings`` (see ``from_config``)."""
    extras = getattr(cfg, "extras", None) or {}
    if "tp_rank" not in extras:
        return []  # the whole model's config of a tensor-parallel build describes no rank engine's inputs
    bindings = parse_bindings(_thawed(extras.get(BINDINGS_KEY)), "ReferenceEngine config", tp_size)
    out = []
    for b in bindings:
        if not null_compute:
            layer = _DOWN_PROJ_INPUT.fullmatch(b.engine_name)
            if b.engine_name == _LM_HEAD_INPUT:
                want: Shape = (geo.vout, geo.h)
            elif layer is not None and int(layer.group(1)) < geo.layers:
                want = (geo.h, geo.f // tp_size)
            else:
                raise InvalidValueError(f"ReferenceEngine: checkpoint weight {b.engine_name!r}: the toy model reads "
                                        f"{_LM_HEAD_INPUT!r} and model.layers.<i>.mlp.down_proj.weight only")
            if b.shape != want:
                raise InvalidValueError(f"ReferenceEngine: checkpoint weight {b.engine_name!r} is {list(b.shape)}, "
                                        f"the toy model's is {list(want)}")
        out.append((b.engine_name, _BINDING_DTYPES[b.dtype], b.shape))
    return out


def _thawed(value: Any) -> Any:
    """A frozen JSON value (a config's extras) as plain lists and dicts."""
    if isinstance(value, Mapping):
        return {k: _thawed(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_thawed(v) for v in value]
    return value


# -- the execution context ----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Plan:
    """A validated binding snapshot: what one execute computes on."""

    shapes: Mapping[str, Shape]
    addresses: Mapping[str, int]
    tree: bool
    views: Mapping[str, Any]  # name -> numpy / CuPy array over the bound memory (inputs and logits/hidden)
    phase: int = 0  # ragged: the extent of execution_phase_marker


class ReferenceExecutionContext:
    """``IExecutionContext`` of a :class:`ReferenceEngine` (see :meth:`execute_async_v3`).

    ``calls`` counts the calls of each state-changing method and of ``execute_async_v3`` (failed
    calls included), so tests can assert that a steady decode step sets nothing.

    Choices where TensorRT's behaviour is not pinned down: switching to another optimization
    profile forgets every input shape; ON_PROFILE_CHANGE allocates like STATIC; user-managed
    memory must be 256-byte aligned. A host-device context enqueues its work through its engine's host
    backend (:attr:`ReferenceEngine.trtio_backend`), so captures must be made on that backend.
    """

    def __init__(self, engine: ReferenceEngine, strategy: ExecutionContextAllocationStrategy, name: str) -> None:
        self._engine = engine
        self._strategy = strategy
        self.name = name
        self.calls: dict[str, int] = {
            "set_input_shape": 0, "set_tensor_address": 0, "set_optimization_profile_async": 0,
            "set_device_memory": 0, "execute_async_v3": 0,
        }
        self._profile = 0
        self._shapes: dict[str, Shape] = {}
        self._addresses: dict[str, int] = {}
        self._plan: _Plan | None = None
        self._memory: tuple[int, int] | None = None  # (ptr, size) of the context memory
        self._owned_memory: Any = None
        self._scratch: _BumpAllocator | None = None
        self._streams: dict[int, Any] = {}
        self._host_backend: Any = None
        if strategy is not ExecutionContextAllocationStrategy.USER_MANAGED and engine.device == "gpu" \
                and not engine.null_compute:
            cupy = _import_cupy()
            size = engine.device_memory_size_v2
            self._owned_memory = cupy.cuda.Memory(size)
            self._set_memory(int(self._owned_memory.ptr), size)

    def __repr__(self) -> str:
        return (f"ReferenceExecutionContext(name={self.name!r}, profile={self._profile}, "
                f"strategy={self._strategy.name})")

    @property
    def engine(self) -> ReferenceEngine:
        return self._engine

    @property
    def active_optimization_profile(self) -> int:
        return self._profile

    @property
    def scratch_peak_bytes(self) -> int:
        """GPU only: the most context memory one execute has used so far (not TensorRT API)."""
        return 0 if self._scratch is None else self._scratch.peak

    def _error(self, call: str, message: str, *args: Any) -> None:
        log.error("%s: %s: " + message, self.name, call, *args)

    def _invalidate(self) -> None:
        self._plan = None

    # -- profiles and shapes -----------------------------------------------------------------------
    def set_optimization_profile_async(self, profile_index: int, stream_handle: int) -> bool:
        """Select profile 0 (prefill) or 1; a change forgets every input shape."""
        self.calls["set_optimization_profile_async"] += 1
        p = _index(profile_index, self._engine.num_optimization_profiles)
        if p is None:
            raise InvalidValueError(f"{self.name}: set_optimization_profile_async: profile index {profile_index!r} "
                                    f"is out of range [0, {self._engine.num_optimization_profiles})")
        if p != self._profile:
            self._profile = p
            self._shapes.clear()
            self._invalidate()
        return True

    def set_input_shape(self, name: str, shape: Sequence[int]) -> bool:
        self.calls["set_input_shape"] += 1
        call = "set_input_shape"
        decl = self._engine._by_name.get(name)
        if decl is None or not decl.is_input:
            self._error(call, "%r is %s", name, "not an I/O tensor" if decl is None else "an output, not an input")
            return False
        try:
            dims = tuple(int(x) for x in shape)
        except (TypeError, ValueError):
            self._error(call, "%r: shape %r is not a sequence of ints", name, shape)
            return False
        if len(dims) != len(decl.shape):
            self._error(call, "%r: shape %s has rank %d, the engine declares rank %d %s",
                        name, dims, len(dims), len(decl.shape), decl.shape)
            return False
        lo, _, hi = decl.profiles[self._profile]
        for axis, (got, static, mn, mx) in enumerate(zip(dims, decl.shape, lo, hi)):
            if static != -1 and got != static:
                self._error(call, "%r: dim %d of %s is %d, but the engine's shape %s fixes it to %d",
                            name, axis, dims, got, decl.shape, static)
                return False
            if not mn <= got <= mx:
                self._error(call, "%r: dim %d of %s is %d, outside profile %d's range [%d, %d] (min %s, max %s)",
                            name, axis, dims, got, self._profile, mn, mx, lo, hi)
                return False
        if self._shapes.get(name) != dims:
            self._shapes[name] = dims
            self._invalidate()
        return True

    def _input_shape(self, decl: _Decl) -> Shape | None:
        shape = self._shapes.get(decl.name)
        if shape is None and decl.is_static:
            return decl.shape
        return shape

    def get_tensor_shape(self, name: str) -> tuple[int, ...]:
        """Inputs: the shape set (the engine's, with -1, until then). Outputs: inferred from the inputs."""
        decl = self._engine._by_name.get(name)
        if decl is None:
            self._error("get_tensor_shape", "%r is not an I/O tensor", name)
            return ()
        if decl.is_input:
            shape = self._input_shape(decl)
            return decl.shape if shape is None else shape
        g = self._engine._geo
        if g.is_ragged:
            return self._ragged_output_shape(decl)
        if name == names.kLogits:
            ids = self._shapes.get(names.kLastTokenIds)
            return (-1, g.vout) if ids is None else (ids[0] * ids[1], g.vout)
        if name == names.kOutputHiddenStates:
            emb = self._shapes.get(names.kInputsEmbeds)
            return decl.shape if emb is None else emb
        assert decl.alias is not None
        cache = self._shapes.get(decl.alias)
        return decl.shape if cache is None else cache

    def _ragged_output_shape(self, decl: _Decl) -> Shape:
        g = self._engine._geo
        if decl.alias is not None:
            return self._shapes.get(decl.alias, decl.shape)
        # logits rows: the selected ones, or one a token (a graph without logits_indices: DFlash's, an assistant's)
        selects = names.kLogitsIndices in self._engine._by_name
        rows = self._shapes.get(names.kLogitsIndices if selects else names.kInputsEmbeds)
        if decl.name == names.kLogits:
            return (-1, g.vout) if rows is None else (rows[0], g.vout)
        if g.role == "draft":  # hidden_states: the final stream at the logits rows, as wide as declared
            width = decl.shape[1] if len(decl.shape) == 2 and decl.shape[1] >= 0 else g.h
            return (-1, width) if rows is None else (rows[0], width)
        emb = self._shapes.get(names.kInputsEmbeds)
        if decl.name != names.kOutputHiddenStates:  # a hybrid base's intermediate states: a row per token
            return decl.shape if emb is None else (emb[0], *decl.shape[1:])
        return (-1, g.hidden_out) if emb is None else (emb[0], g.hidden_out)

    def infer_shapes(self) -> list[str]:
        """Names of the inputs whose shapes are still unspecified; :class:`~trtio.EngineError` if the shapes set
        disagree."""
        missing = [d.name for d in self._engine._decls if d.is_input and self._input_shape(d) is None]
        if not missing:
            problems = self._shape_problems()
            if problems:
                for problem in problems:
                    self._error("infer_shapes", "%s", problem)
                raise EngineError(f"{self.name}: infer_shapes: " + "; ".join(problems))
        return missing

    # -- addresses and memory ----------------------------------------------------------------------
    def set_tensor_address(self, name: str, memory: int) -> bool:
        self.calls["set_tensor_address"] += 1
        call = "set_tensor_address"
        if name not in self._engine._by_name:
            self._error(call, "%r is not an I/O tensor", name)
            return False
        ptr = int(memory)
        if ptr == 0:
            self._error(call, "%r: address is null (bind a small dummy buffer for an empty tensor)", name)
            return False
        if ptr < 0 or ptr % ADDRESS_ALIGNMENT:
            self._error(call, "%r: address 0x%x is not %d-byte aligned", name, ptr, ADDRESS_ALIGNMENT)
            return False
        if self._addresses.get(name) != ptr:
            self._addresses[name] = ptr
            self._invalidate()
        return True

    def get_tensor_address(self, name: str) -> int:
        if name not in self._engine._by_name:
            self._error("get_tensor_address", "%r is not an I/O tensor", name)
            return 0
        return self._addresses.get(name, 0)

    def set_device_memory(self, memory: int, size: int) -> None:
        """USER_MANAGED only (:class:`~trtio.EngineError` otherwise): the context memory, 256-byte aligned
        (:class:`~trtio.InvalidValueError` otherwise)."""
        self.calls["set_device_memory"] += 1
        if self._strategy is not ExecutionContextAllocationStrategy.USER_MANAGED:
            raise EngineError(f"{self.name}: set_device_memory needs a context created with "
                              f"ExecutionContextAllocationStrategy.USER_MANAGED, this one is {self._strategy.name}")
        ptr, size = int(memory), int(size)
        if ptr <= 0 or ptr % ADDRESS_ALIGNMENT:
            raise InvalidValueError(f"{self.name}: set_device_memory: address 0x{ptr:x} is not a "
                                    f"{ADDRESS_ALIGNMENT}-byte aligned device address")
        if size < 0:
            raise InvalidValueError(f"{self.name}: set_device_memory: size {size} is negative")
        if self._memory != (ptr, size):
            self._set_memory(ptr, size)
            self._invalidate()

    def _set_memory(self, ptr: int, size: int) -> None:
        self._memory = (ptr, size)
        if self._engine.device == "gpu" and not self._engine.null_compute:
            self._scratch = _BumpAllocator(_import_cupy(), self.name, ptr, size, self._engine._device_id)

    def update_device_memory_size_for_shapes(self) -> int:
        """The context memory the active profile needs (the reference engine sizes per profile)."""
        return self._engine.get_device_memory_size_for_profile_v2(self._profile)

    # -- validation ---------------------------------------------------------------------------------
    def _set_shapes(self) -> dict[str, Shape]:
        """Every input's shape (all are set when this is called; the declared one stands in otherwise)."""
        out = {}
        for d in self._engine._decls:
            if d.is_input:
                shape = self._input_shape(d)
                out[d.name] = d.shape if shape is None else shape
        return out

    def _shape_problems(self) -> list[str]:
        """Disagreements between input shapes that TensorRT's shape inference would refuse."""
        g = self._engine._geo
        shapes = self._set_shapes()
        return _ragged_shape_problems(g, shapes) if g.is_ragged else _batch_shape_problems(g, shapes)

    def _validate(self) -> _Plan | None:
        engine = self._engine
        problems: list[str] = []
        for decl in engine._decls:
            if decl.is_input and self._input_shape(decl) is None:
                problems.append(f"input {decl.name!r} has no shape (set_input_shape was not called "
                                f"since the profile was selected)")
        for decl in engine._decls:
            if not self._addresses.get(decl.name):
                problems.append(f"{decl.name!r} has no address (set_tensor_address)")
        for decl in engine._decls:
            if decl.alias is None:
                continue
            out_ptr, in_ptr = self._addresses.get(decl.name, 0), self._addresses.get(decl.alias, 0)
            if out_ptr and in_ptr and out_ptr != in_ptr:
                problems.append(f"{decl.name!r} is bound to 0x{out_ptr:x} but its input {decl.alias!r} to "
                                f"0x{in_ptr:x}: KVCacheUpdate writes the cache in place, bind both to one address")
        if not problems:
            problems += self._shape_problems()
        if self._strategy is ExecutionContextAllocationStrategy.USER_MANAGED:
            need = engine.get_device_memory_size_for_profile_v2(self._profile)
            if self._memory is None:
                problems.append(f"no context memory (USER_MANAGED: call set_device_memory with {need} bytes)")
            elif self._memory[1] < need:
                problems.append(f"context memory of {self._memory[1]} bytes is smaller than the "
                                f"{need} bytes profile {self._profile} needs")
        if problems:
            for problem in problems:
                self._error("execute_async_v3", "%s", problem)
            return None
        shapes = {d.name: self.get_tensor_shape(d.name) for d in engine._decls}
        g = engine._geo
        tree = not g.is_ragged and g.is_spec and shapes[names.kAttentionMask][1] > 1
        phase = shapes[names.kExecutionPhaseMarker][0] if g.is_ragged else 0
        views = {} if engine.null_compute else self._views(shapes)
        return _Plan(shapes=shapes, addresses=dict(self._addresses), tree=tree, views=views, phase=phase)

    def _views(self, shapes: Mapping[str, Shape]) -> dict[str, Any]:
        engine = self._engine
        make: Callable[[int, Shape, np.dtype], Any]
        if engine.device == "gpu":
            cupy = _import_cupy()
            device_id = engine._device_id

            def make(ptr: int, shape: Shape, dtype: np.dtype) -> Any:
                nbytes = int(np.prod(shape)) * dtype.itemsize
                mem = cupy.cuda.UnownedMemory(ptr, nbytes, self, device_id)
                return cupy.ndarray(shape, dtype=dtype, memptr=cupy.cuda.MemoryPointer(mem, 0))
        else:
            def make(ptr: int, shape: Shape, dtype: np.dtype) -> Any:
                nbytes = int(np.prod(shape)) * dtype.itemsize
                return host_view(ptr, nbytes).view(dtype).reshape(shape)

        views = {}
        unread = _RAGGED_UNREAD if engine._geo.is_ragged else frozenset()
        if engine._geo.types:  # a hybrid's recurrent layers read each sequence's slot
            unread = unread - {names.kStateIndices}
        if getattr(engine._geo, "tree_base", False):  # and a tree base's verify each node's parent
            unread = unread - {names.kTreeParentIds}
        for decl in engine._decls:
            if decl.alias is not None or decl.name in unread:
                continue  # a present_* output is its cache input's memory; shape-only inputs have no data
            if decl.name == names.kSwaKVCacheMode:  # Gemma 4's shape-only mode (extent 0 or 1): its shape alone
                views[decl.name] = np.empty(shapes[decl.name], np.int8)
                continue
            # bf16 and fp8 are computed on as their bits (CuPy has neither dtype)
            raw_bits: dict[DType, np.dtype] = {DType.BFLOAT16: np.dtype("uint16"), DType.FP8: np.dtype("uint8")}
            dtype = raw_bits.get(decl.dtype, decl.dtype.storage_numpy)
            views[decl.name] = make(self._addresses[decl.name], shapes[decl.name], dtype)
        return views

    # -- execution -------------------------------------------------------------------------------------
    def execute_async_v3(self, stream_handle: int) -> bool:
        """Enqueue one step on ``stream_handle``; False (with the reasons logged) if the bindings are incomplete.

        Validation runs only after a ``set_*`` call changed something, so a steady-state execute
        costs a lookup and a launch. The work reads and writes the bound memory in stream order:
        on the host device it runs when the host backend runs the stream's work (now, or at each
        replay of a captured graph); on the GPU it is CuPy kernels on the stream.
        """
        self.calls["execute_async_v3"] += 1
        plan = self._plan
        if plan is None:
            plan = self._plan = self._validate()
            if plan is None:
                return False
        engine = self._engine
        if engine.null_compute:
            return True
        stream = int(stream_handle)
        if engine.device == "gpu":
            self._execute_gpu(plan, stream)
        else:
            if self._host_backend is None:
                from trtio._cuda.backend import get_backend  # noqa: PLC0415

                self._host_backend = get_backend(engine.trtio_backend)
            self._host_backend.launch_host_func(stream, lambda: self._compute_host(plan, stream))
        return True

    def _compute_host(self, plan: _Plan, stream: int) -> None:
        engine = self._engine
        if engine._gemma4 is not None:
            try:
                with np.errstate(all="ignore"):
                    gemma4_forward(engine.config, engine._gemma4, plan.views)
            except InvalidValueError as exc:
                raise InvalidValueError(f"{self.name}: execute_async_v3: {exc}") from None
            return
        assert engine._host_weights is not None
        weights = engine._bound_weights(np, engine._host_weights, plan.views)
        try:
            # An engine does not warn about NaN or inf in what it is given; it computes on.
            with np.errstate(all="ignore"):
                if engine._geo.dflash:
                    forward_dflash(np, np.matmul, _scatter_rows_host, engine._geo, weights, plan.views, _NoScratch(),
                                   checked=True)
                elif engine._geo.is_ragged:
                    _forward_ragged(np, np.matmul, _scatter_rows_host, engine._geo, weights, plan.views,
                                    plan.phase, _NoScratch(), checked=True,
                                    all_reduce=engine._all_reduce_on(np, stream))
                else:
                    _forward(np, np.matmul, engine._geo, engine._host_weights, plan.views, plan.tree, _NoScratch(),
                             checked=True)
        except _DataError as exc:
            raise InvalidValueError(f"{self.name}: execute_async_v3: {exc}") from None

    def _execute_gpu(self, plan: _Plan, stream_handle: int) -> None:
        engine = self._engine
        scratch = self._scratch
        assert scratch is not None and engine._gpu_weights is not None and engine._gpu_matmul is not None
        with gpu_scope(self._streams, stream_handle, engine._device_id, scratch) as cupy:
            if engine._geo.dflash:
                assert engine._gpu_scatter is not None
                forward_dflash(cupy, engine._gpu_matmul, engine._gpu_scatter, engine._geo,
                               engine._bound_weights(cupy, engine._gpu_weights, plan.views), plan.views, scratch,
                               checked=False)
            elif engine._gemma4 is not None:
                assert engine._gpu_scatter is not None
                gemma4_forward(engine.config, engine._gemma4, plan.views, xp=cupy, mm=engine._gpu_matmul,
                               scatter=engine._gpu_scatter, scratch=scratch, checked=False)
            elif engine._geo.is_ragged:
                assert engine._gpu_scatter is not None
                _forward_ragged(cupy, engine._gpu_matmul, engine._gpu_scatter, engine._geo,
                                engine._bound_weights(cupy, engine._gpu_weights, plan.views), plan.views, plan.phase,
                                scratch, checked=False, all_reduce=engine._all_reduce_on(cupy, stream_handle))
            else:
                _forward(cupy, engine._gpu_matmul, engine._geo, engine._gpu_weights, plan.views, plan.tree, scratch,
                         checked=False)
