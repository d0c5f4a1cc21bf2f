"""NVIDIA's exported ONNX graph, run as a TensorRT engine: real-graph parity without a GPU.

:class:`OnnxEngine` implements the part of TensorRT 10/11's ``ICudaEngine`` / ``IExecutionContext`` API trtio uses
(as :class:`~trtio.testing.ReferenceEngine` does), with the I/O the graph declares (names, dtypes, dimensions) and
the optimization profiles Edge-LLM 0.11's builder gives them (:mod:`trtio.testing.onnx_profiles`: two for a
decoder, one for a Qwen vision encoder's ``visual/`` graph or an audio encoder's ``audio/`` graph). Its execute
runs the graph that ``tensorrt-edgellm-export`` wrote on the memory bound to it: standard ONNX ops through
``onnx.reference.ReferenceEvaluator`` (the ``onnx`` package, numpy; no onnxruntime, no torch), Edge-LLM's custom
ops through the numpy models of :mod:`trtio.testing.edgellm_plugins`, written from Edge-LLM's C++. Driven by trtio
exactly as a real engine, it shows whether every runtime input trtio writes means what NVIDIA's graph and plugins
take it to mean: compare its logits with Hugging Face's on the same checkpoint (``docs/guide/parity.md``).

Where it runs:

* On a host backend (``host``, :class:`~trtio.testing.AsyncHostBackend`, ...) the graph computes on the bound host
  memory in place, enqueued with the backend's ``launch_host_func``: in stream order, and recorded into a host
  "graph" while the stream is captured.
* On the ``cuda`` backend every execute enqueues, on the step's stream, a copy of each input (the KV and state pools
  whole; inputs bound to one device range, as a KV-sharing consumer's pool and its donor's, share one mirror) into
  pinned host mirrors, a CUDA host function that runs the graph on the mirrors, and a copy of each
  output and pool back. The three are capturable into a CUDA graph; the host function makes no CUDA call. The
  mirrors are allocated at the first execute (never during a capture), sized for the profiles' largest shapes.

Standard ops are ONNX's, but for ``MatMul`` and ``Gemm`` on half operands, which accumulate in fp32 and round the
result to half once, as TensorRT's GEMMs do (numpy's float16 matmul rounds at every step).

Choices where TensorRT leaves room, as ReferenceEngine makes them: ``execute_async_v3`` returns False (logging each
reason) for an input without a shape, an I/O without an address, a ``present_*`` output not bound to its pool's
address (the plugins write the pool in place), or missing USER_MANAGED context memory. Switching profiles forgets
the input shapes. ``get_aliased_input_tensor`` answers None, as an engine Edge-LLM builds does (its plugins declare
no alias): trtio pairs ``present_*`` with ``past_*`` by name. A plugin model that refuses its inputs raises
:class:`~trtio.InvalidValueError` from the enqueued work (the host backend: at the execute or the next
synchronisation; the cuda backend: at the next synchronisation of the stream, as a CUDA error would surface).

``input_hook``: a callable given the step's input arrays (name -> numpy view, writable) just before the graph runs,
for tests that plant a wrong runtime input and show the parity check catches it.
"""

from __future__ import annotations

import ast
import ctypes
import itertools
import json
import logging
import operator
import os
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from trtio._cuda._hostmem import host_view
from trtio._cuda._location import Location
from trtio._cuda.backend import Backend, get_backend
from trtio._dtypes import DType
from trtio._tensor import Tensor
from trtio.errors import ConfigError, EngineError, InvalidValueError, UnknownNameError
from trtio.testing.onnx_profiles import (
    Profiles,
    audio_profiles,
    builder_profiles,
    reduced_capacity,
    swa_pool_pages,
    visual_profiles,
)
from trtio.testing.reference_io import DataType, ExecutionContextAllocationStrategy, TensorIOMode, TensorLocation

__all__ = ["DataType", "ExecutionContextAllocationStrategy", "OnnxEngine", "OnnxExecutionContext",
           "TensorIOMode", "TensorLocation"]

log = logging.getLogger("trtio.testing.onnx")

Shape = tuple[int, ...]
InputHook = Callable[[dict[str, np.ndarray]], None]

_ALIGNMENT = 256
_CONTEXT_MEMORY = 512  # the numpy plugins need no workspace; a real engine's is larger
# ONNX TensorProto element types -> trtio DTypes (the ones Edge-LLM's graphs use at their I/O).
_ONNX_DTYPES = {1: DType.FLOAT32, 2: DType.UINT8, 3: DType.INT8, 6: DType.INT32, 7: DType.INT64, 9: DType.BOOL,
                10: DType.FLOAT16, 16: DType.BFLOAT16, 17: DType.FP8}
_POOL_PREFIXES = ("past_key_values_", "conv_state_", "recurrent_state_")


def _import_onnx() -> Any:
    try:
        import onnx  # noqa: PLC0415 - optional, loaded on use
        from onnx.reference import ReferenceEvaluator  # noqa: PLC0415, F401
    except ImportError as exc:
        raise EngineError("OnnxEngine needs the onnx package (pip install onnx, or trtio's 'test' extra)") from exc
    return onnx


@dataclass(frozen=True)
class _IO:
    name: str
    is_input: bool
    dtype: DType
    shape: Shape  # -1 where the graph names a symbol
    symbols: tuple[str | None, ...]
    alias: str | None = None  # a present_* output: the pool input it is written into


def _present_of(name: str, inputs: Mapping[str, _IO]) -> str | None:
    """The input a ``present_*`` output is that input's pool: ``present_key_values_i`` -> ``past_key_values_i``,
    ``present_conv_state_j`` -> ``conv_state_j``, ``present_recurrent_state_j`` -> ``recurrent_state_j``."""
    if not name.startswith("present_"):
        return None
    rest = name[len("present_"):]
    for candidate in (f"past_{rest}", rest):
        if candidate in inputs:
            return candidate
    return None


class OnnxEngine:
    """A TensorRT-engine stand-in that runs Edge-LLM's exported graph (see the module docstring)."""

    def __init__(self, path: Path, model: Any, config: dict[str, Any], backend: Backend, *, name: str) -> None:
        onnx = _import_onnx()
        from trtio.testing.edgellm_plugins import onnx_ops  # noqa: PLC0415 - needs onnx

        self._path = path
        self._model = model
        self._config = config
        self._backend = backend
        self._name = name
        graph = model.graph
        decls: list[_IO] = []
        for value, is_input in [(v, True) for v in graph.input] + [(v, False) for v in graph.output]:
            t = value.type.tensor_type
            dtype = _ONNX_DTYPES.get(t.elem_type)
            if dtype is None:
                raise EngineError(f"{path}: {value.name!r} has ONNX element type {t.elem_type}, which no TensorRT "
                                  "engine binding of Edge-LLM's uses")
            dims = [d.dim_value if d.HasField("dim_value") else -1 for d in t.shape.dim]
            symbols = tuple(d.dim_param if d.HasField("dim_param") else None for d in t.shape.dim)
            decls.append(_IO(value.name, is_input, dtype, tuple(dims), symbols))
        inputs = {d.name: d for d in decls if d.is_input}
        decls = [d if d.is_input else _IO(d.name, False, d.dtype, d.shape, d.symbols, _present_of(d.name, inputs))
                 for d in decls]
        self._decls = tuple(decls)
        self._by_name = {d.name: d for d in decls}
        builder = config.get("builder_config")
        visual, audio = _is_visual(inputs), _is_audio(inputs)
        if not isinstance(builder, Mapping):
            needs = "min_image_tokens, max_image_tokens, max_image_tokens_per_image" if visual else \
                "min_time_steps, max_time_steps" if audio else "batch, input length, KV capacity, ..."
            raise ConfigError(f"{path}: builder_config", f"is missing: pass builder_config= ({needs} as Edge-LLM's "
                                                         "builder writes them)")
        shapes = {d.name: d.shape for d in decls if d.is_input}
        self._profiles: Profiles = visual_profiles(shapes, builder) if visual else \
            audio_profiles(shapes, builder) if audio else builder_profiles(shapes, config, builder)
        self._num_profiles = len(next(iter(self._profiles.values()))) if self._profiles else 1
        self._evaluator = onnx.reference.ReferenceEvaluator(model, new_ops=[*onnx_ops(), *_tensorrt_gemms()])
        self._context_ids = itertools.count()
        self.input_hook: InputHook | None = None

    # -- construction -----------------------------------------------------------------------------------
    @classmethod
    def from_export(cls, export_dir: str | os.PathLike[str], builder_config: Mapping[str, Any] | None = None, *,
                    backend: Backend | str | None = None) -> OnnxEngine:
        """The engine of the folder ``tensorrt-edgellm-export`` wrote for one role (``llm/``, a pair's ``base/`` or
        ``draft/``, a VLM's ``visual/``, a speech model's ``audio/``): its ``model.onnx`` (+ ``model.onnx.data``) and
        ``config.json``. ``builder_config`` is what Edge-LLM's builder adds to ``config.json``: for a decoder
        ``max_batch_size``, ``max_input_len``, ``max_kv_cache_capacity``, ``max_lora_rank``, ``max_verify_tree_size`` /
        ``max_draft_tree_size``, ``spec_base`` / ``spec_draft`` (the derived keys ``max_kv_pool_pages``,
        ``ragged_backend``, ``tp_size`` are filled in as the builder writes them); for a vision encoder
        ``min_image_tokens``, ``max_image_tokens``, ``max_image_tokens_per_image``; for an audio encoder
        ``min_time_steps``, ``max_time_steps``. None: the config's own
        ``builder_config``. ``backend``: where trtio's tensors live (the execute runs there; default auto)."""
        onnx = _import_onnx()
        root = Path(export_dir)
        model_file, config_file = root / "model.onnx", root / "config.json"
        for file in (model_file, config_file):
            if not file.is_file():
                raise ConfigError(str(file), f"is missing: {root} is not a folder tensorrt-edgellm-export wrote")
        config = json.loads(config_file.read_text())
        model = onnx.load(str(model_file))
        names = {i.name for i in model.graph.input}
        complete = (lambda b, _c: b) if _is_visual(names) or _is_audio(names) else _completed
        if builder_config is not None:
            config["builder_config"] = complete(dict(builder_config), config)
        elif "builder_config" in config:
            config["builder_config"] = complete(dict(config["builder_config"]), config)
        _tree_base_keys(config, names)
        return cls(root, model, config, get_backend(backend), name=f"{root.parent.name}/{root.name}")

    # -- what trtio reads beside the TensorRT API --------------------------------------------------------
    @property
    def config(self) -> dict[str, Any]:
        """``config.json`` as Edge-LLM's builder writes it beside the engine (the export's, with
        ``builder_config``): a copy, for :meth:`trtio.LLMEngineConfig.from_edgellm` or an engine directory."""
        copy: dict[str, Any] = json.loads(json.dumps(self._config))
        return copy

    @property
    def path(self) -> Path:
        return self._path

    @property
    def trtio_backend(self) -> Backend:
        return self._backend

    def __repr__(self) -> str:
        return f"OnnxEngine({self._name!r}, {len(self._decls)} I/O tensors)"

    # -- ICudaEngine ------------------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self._name

    @property
    def num_io_tensors(self) -> int:
        return len(self._decls)

    @property
    def num_optimization_profiles(self) -> int:
        return self._num_profiles

    def __len__(self) -> int:
        return len(self._decls)

    def __getitem__(self, index: int) -> str:
        if not isinstance(index, int) or not -len(self._decls) <= index < len(self._decls):
            raise InvalidValueError(f"{self._name}: I/O tensor index {index!r} out of range [0, {len(self._decls)})")
        return self._decls[index].name

    def get_tensor_name(self, index: int) -> str | None:
        if not isinstance(index, int) or not 0 <= index < len(self._decls):
            log.error("%s: get_tensor_name: index %r is out of range [0, %d)", self._name, index, len(self._decls))
            return None
        return self._decls[index].name

    def _lookup(self, call: str, name: str) -> _IO | None:
        decl = self._by_name.get(name)
        if decl is None:
            log.error("%s: %s: %r is not an I/O tensor of this engine", self._name, call, name)
        return decl

    def get_tensor_mode(self, name: str) -> TensorIOMode:
        decl = self._lookup("get_tensor_mode", name)
        if decl is None:
            return TensorIOMode.NONE
        return TensorIOMode.INPUT if decl.is_input else TensorIOMode.OUTPUT

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
        decl = self._by_name.get(name)
        if decl is None:
            raise UnknownNameError(f"{self._name}: get_tensor_profile_shape: {name!r} is not an I/O tensor")
        if not decl.is_input:
            raise InvalidValueError(f"{self._name}: get_tensor_profile_shape: {name!r} is an output, not an input")
        if profile_index not in range(self._num_profiles):
            raise InvalidValueError(f"{self._name}: get_tensor_profile_shape: profile index {profile_index!r} is "
                                    f"out of range [0, {self._num_profiles})")
        return list(self._profiles[name][profile_index])

    def get_aliased_input_tensor(self, name: str) -> str | None:
        self._lookup("get_aliased_input_tensor", name)
        return None

    @property
    def device_memory_size_v2(self) -> int:
        return _CONTEXT_MEMORY

    def get_device_memory_size_for_profile_v2(self, profile_index: int) -> int:
        return _CONTEXT_MEMORY if profile_index in range(self._num_profiles) else 0

    def create_execution_context(
        self, strategy: ExecutionContextAllocationStrategy | int = ExecutionContextAllocationStrategy.STATIC,
    ) -> OnnxExecutionContext:
        try:
            strategy = ExecutionContextAllocationStrategy(int(strategy))
        except (TypeError, ValueError):
            raise InvalidValueError(f"{self._name}: create_execution_context: unknown allocation strategy "
                                    f"{strategy!r}") from None
        return OnnxExecutionContext(self, strategy, f"{self._name}.context{next(self._context_ids)}")

    # -- for the context ----------------------------------------------------------------------------------
    @property
    def decls(self) -> tuple[_IO, ...]:
        return self._decls

    def decl(self, name: str) -> _IO | None:
        return self._by_name.get(name)

    def profile(self, name: str, index: int) -> tuple[Shape, Shape, Shape]:
        return self._profiles[name][index]

    def run_graph(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run the graph on ``inputs`` (views of the bound memory: the plugins write pools in them). Returns the
        outputs by name. A plugin model's refusal is re-raised as :class:`~trtio.InvalidValueError`."""
        if self.input_hook is not None:
            self.input_hook(inputs)
        try:
            with np.errstate(all="ignore"):
                results = self._evaluator.run(None, inputs)
        except InvalidValueError as exc:
            raise InvalidValueError(f"{self._name}: execute_async_v3: {exc}") from None
        except Exception as exc:
            cause = exc.__cause__ or exc.__context__
            if isinstance(cause, InvalidValueError):
                raise InvalidValueError(f"{self._name}: execute_async_v3: {cause}") from None
            raise
        outputs = [d.name for d in self._decls if not d.is_input]
        return dict(zip(outputs, results))


def _tensorrt_gemms() -> list[type]:
    """``MatMul`` and ``Gemm`` as TensorRT runs them on half operands: products accumulated in fp32, the result
    rounded to half once (numpy's float16 matmul rounds as it goes, and is slow); other dtypes as ONNX says."""
    from onnx.reference.op_run import OpRun  # noqa: PLC0415 - optional dependency

    def matmul(self: Any, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray]:
        if a.dtype == np.float16 and b.dtype == np.float16:
            return (np.matmul(a.astype(np.float32), b.astype(np.float32)).astype(np.float16),)
        return (np.matmul(a, b),)

    def gemm(self: Any, a: np.ndarray, b: np.ndarray, c: np.ndarray | None = None, alpha: float = 1.0,
             beta: float = 1.0, transA: int = 0, transB: int = 0) -> tuple[np.ndarray]:  # noqa: N803 - ONNX's names
        dtype = a.dtype
        wide = np.float32 if dtype == np.float16 else dtype
        x, y = a.astype(wide), b.astype(wide)
        out = np.float32(alpha) * ((x.T if transA else x) @ (y.T if transB else y))
        if c is not None:
            out = out + np.float32(beta) * c.astype(wide)
        return (out.astype(dtype),)

    return [type("MatMul", (OpRun,), {"op_domain": "", "_run": matmul}),
            type("Gemm", (OpRun,), {"op_domain": "", "_run": gemm}), _patch_conv()]


def _patch_conv() -> type:
    """``Conv`` whose kernel tiles its input (strides equal to the kernel, no padding, dilation or groups: a ViT's
    patch embedding) as one matrix product, accumulated in fp32 and rounded once as ``MatMul``; any other
    convolution as ``onnx.reference`` computes it (whose loop takes seconds on a 448-pixel tile)."""
    from onnx.reference.ops.op_conv import Conv  # noqa: PLC0415 - optional dependency

    def conv(self: Any, x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None, auto_pad: Any = None,
             dilations: Any = None, group: Any = None, kernel_shape: Any = None, pads: Any = None,
             strides: Any = None) -> tuple[np.ndarray]:
        kernel = tuple(kernel_shape or w.shape[2:])
        tiles = (x.ndim == 4 and (group or 1) == 1 and auto_pad in (None, "NOTSET", b"NOTSET")
                 and tuple(strides or (1, 1)) == kernel and not any(pads or ()) and all(d == 1 for d in dilations or ())
                 and x.shape[2] % kernel[0] == 0 and x.shape[3] % kernel[1] == 0)
        if not tiles:
            return Conv._run(self, x, w, b, auto_pad=auto_pad, dilations=dilations, group=group,  # type: ignore
                             kernel_shape=kernel_shape, pads=pads, strides=strides)
        n, c, h, wd = x.shape
        kh, kw = kernel
        wide = np.float32 if x.dtype == np.float16 else x.dtype
        cols = x.reshape(n, c, h // kh, kh, wd // kw, kw).transpose(0, 2, 4, 1, 3, 5).reshape(-1, c * kh * kw)
        out = cols.astype(wide) @ w.reshape(w.shape[0], -1).T.astype(wide)
        if b is not None:
            out = out + b.astype(wide)
        out = out.reshape(n, h // kh, wd // kw, w.shape[0]).transpose(0, 3, 1, 2)
        return (np.ascontiguousarray(out.astype(x.dtype)),)

    return type("Conv", (Conv,), {"op_domain": "", "_run": conv})


def _is_visual(inputs: Iterable[str]) -> bool:
    """A vision encoder's graph (``visual/``): patches ``input`` and ``cu_seqlens``, or ``input`` alone (tiles whose
    attention descriptors the graph holds), no ``inputs_embeds``."""
    names = set(inputs)
    return ({"input", "cu_seqlens"} <= names or names == {"input"}) and "inputs_embeds" not in names


def _is_audio(inputs: Iterable[str]) -> bool:
    """An audio encoder's graph (``audio/``): ``padded_feature`` and ``padded_mask_after_cnn_indices``."""
    return {"padded_feature", "padded_mask_after_cnn_indices"} <= set(inputs)


_DIM_OPS: dict[type, Callable[[int, int], int]] = {ast.Add: operator.add, ast.Sub: operator.sub,
                                                    ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv}


def _dim(symbol: str, known: Mapping[str, int]) -> int:
    """A symbolic dimension's value: a symbol the inputs' shapes bind, or an expression the exporter wrote over
    them (``(total_tokens//4)``, ``4*num_groups``, ``num_sequences + 1``); -1 where a symbol is unknown."""
    if symbol in known:
        return known[symbol]

    def value(node: ast.AST) -> int | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name):
            return known.get(node.id)
        if isinstance(node, ast.BinOp) and type(node.op) in _DIM_OPS:
            left, right = value(node.left), value(node.right)
            if left is None or right is None or (isinstance(node.op, ast.FloorDiv) and right == 0):
                return None
            return _DIM_OPS[type(node.op)](left, right)
        return None

    try:
        tree = ast.parse(symbol, mode="eval")
    except SyntaxError:
        return -1
    found = value(tree.body)
    return -1 if found is None else found


def _tree_base_keys(config: dict[str, Any], inputs: set[str]) -> None:
    """The tree-base key Edge-LLM's builder writes into a spec-decode base's config (``experimental/builder/core/
    artifacts/runtime_config.py``): ``dflash_tree_base`` on a DFlash base (true: ``models/dflash/configuration.py::
    configure_base`` sets it on every one, as the exporter's ``--dflash-base`` does), ``mtp_tree_base`` on an MTP base
    (the builder's ``--tree-base``, which must match the export's ``--mtp-tree-base``: whether the graph reads
    ``tree_parent_ids``). Keys the export's config has are kept."""
    if config.get("engine_role") != "base":
        return
    kind = config.get("spec_decode_type")
    if kind == "dflash":
        config.setdefault("dflash_tree_base", True)
    elif kind == "jetspec":  # the exporter writes it (false unless --jetspec-tree-base)
        config.setdefault("jetspec_tree_base", False)
    elif kind == "mtp":
        config.setdefault("mtp_tree_base", "tree_parent_ids" in inputs)


def _completed(builder: dict[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
    """``builder`` with the keys Edge-LLM's builder derives (``runtime_config.py::build_runtime_config``)."""
    role = config.get("engine_role", "llm")
    builder.setdefault("tp_size", 1)
    builder.setdefault("max_lora_rank", 0)
    builder.setdefault("spec_base", role == "base")
    builder.setdefault("spec_draft", role == "draft")
    builder.setdefault("ragged_backend", "entry_padded_compatibility")
    batch, capacity = builder.get("max_batch_size"), builder.get("max_kv_cache_capacity")
    if isinstance(batch, int) and isinstance(capacity, int):
        builder.setdefault("max_kv_pool_pages", batch * -(-capacity // 128))
        window = reduced_capacity(config, capacity)  # Gemma 4: LLMBuilderConfig::resolveNumSwaPages persists it
        if window:
            builder.setdefault("num_swa_pages", swa_pool_pages(batch, window))
    return builder


class OnnxExecutionContext:
    """``IExecutionContext`` of an :class:`OnnxEngine` (see the module docstring)."""

    def __init__(self, engine: OnnxEngine, strategy: ExecutionContextAllocationStrategy, name: str) -> None:
        self._engine = engine
        self._strategy = strategy
        self.name = name
        self.calls: dict[str, int] = {"set_input_shape": 0, "set_tensor_address": 0,
                                      "set_optimization_profile_async": 0, "set_device_memory": 0,
                                      "execute_async_v3": 0}
        self._profile = 0
        self._shapes: dict[str, Shape] = {}
        self._addresses: dict[str, int] = {}
        self._memory: tuple[int, int] | None = None
        self._mirror: _Mirror | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"OnnxExecutionContext(name={self.name!r}, profile={self._profile})"

    @property
    def engine(self) -> OnnxEngine:
        return self._engine

    @property
    def active_optimization_profile(self) -> int:
        return self._profile

    def _error(self, call: str, message: str, *args: Any) -> None:
        log.error("%s: %s: " + message, self.name, call, *args)

    def set_optimization_profile_async(self, profile_index: int, stream_handle: int) -> bool:
        self.calls["set_optimization_profile_async"] += 1
        count = self._engine.num_optimization_profiles
        if profile_index not in range(count):
            raise InvalidValueError(f"{self.name}: set_optimization_profile_async: profile index {profile_index!r} "
                                    f"is out of range [0, {count})")
        if profile_index != self._profile:
            self._profile = profile_index
            self._shapes.clear()
        return True

    def set_input_shape(self, name: str, shape: Sequence[int]) -> bool:
        self.calls["set_input_shape"] += 1
        decl = self._engine.decl(name)
        if decl is None or not decl.is_input:
            self._error("set_input_shape", "%r is %s", name, "not an I/O tensor" if decl is None else "an output")
            return False
        dims = tuple(int(x) for x in shape)
        if len(dims) != len(decl.shape):
            self._error("set_input_shape", "%r: shape %s has rank %d, the engine declares %s", name, dims, len(dims),
                        decl.shape)
            return False
        lo, _, hi = self._engine.profile(name, self._profile)
        for axis, (got, static, mn, mx) in enumerate(zip(dims, decl.shape, lo, hi)):
            if static != -1 and got != static:
                self._error("set_input_shape", "%r: dim %d of %s is %d, the engine fixes it to %d", name, axis, dims,
                            got, static)
                return False
            if not mn <= got <= mx:
                self._error("set_input_shape", "%r: dim %d of %s is %d, outside profile %d's range [%d, %d]", name,
                            axis, dims, got, self._profile, mn, mx)
                return False
        self._shapes[name] = dims
        return True

    def _input_shape(self, decl: _IO) -> Shape | None:
        shape = self._shapes.get(decl.name)
        if shape is None and -1 not in decl.shape:
            return decl.shape
        return shape

    def _symbols(self) -> dict[str, int]:
        known: dict[str, int] = {}
        for decl in self._engine.decls:
            if not decl.is_input:
                continue
            shape = self._input_shape(decl)
            if shape is None:
                continue
            for symbol, value in zip(decl.symbols, shape):
                if symbol is not None:
                    known.setdefault(symbol, value)
        return known

    def get_tensor_shape(self, name: str) -> tuple[int, ...]:
        """Inputs: the shape set (-1 where unset). Outputs: the graph's symbols resolved from the inputs' shapes (a
        present_* output: its pool's shape)."""
        decl = self._engine.decl(name)
        if decl is None:
            self._error("get_tensor_shape", "%r is not an I/O tensor", name)
            return ()
        if decl.is_input:
            shape = self._input_shape(decl)
            return decl.shape if shape is None else shape
        if decl.alias is not None:
            pool = self._engine.decl(decl.alias)
            assert pool is not None
            shape = self._input_shape(pool)
            return pool.shape if shape is None else shape
        known = self._symbols()
        return tuple(_dim(s, known) if s is not None else d for s, d in zip(decl.symbols, decl.shape))

    def infer_shapes(self) -> list[str]:
        return [d.name for d in self._engine.decls if d.is_input and self._input_shape(d) is None]

    def set_tensor_address(self, name: str, memory: int) -> bool:
        self.calls["set_tensor_address"] += 1
        if self._engine.decl(name) is None:
            self._error("set_tensor_address", "%r is not an I/O tensor", name)
            return False
        ptr = int(memory)
        if ptr <= 0 or ptr % _ALIGNMENT:
            self._error("set_tensor_address", "%r: address 0x%x is null or not %d-byte aligned", name, ptr,
                        _ALIGNMENT)
            return False
        self._addresses[name] = ptr
        return True

    def get_tensor_address(self, name: str) -> int:
        return self._addresses.get(name, 0)

    def set_device_memory(self, memory: int, size: int) -> None:
        self.calls["set_device_memory"] += 1
        if self._strategy is not ExecutionContextAllocationStrategy.USER_MANAGED:
            raise EngineError(f"{self.name}: set_device_memory needs a USER_MANAGED context, this one is "
                              f"{self._strategy.name}")
        if int(memory) <= 0 or int(memory) % _ALIGNMENT:
            raise InvalidValueError(f"{self.name}: set_device_memory: address 0x{int(memory):x} is not "
                                    f"{_ALIGNMENT}-byte aligned")
        self._memory = (int(memory), int(size))

    def update_device_memory_size_for_shapes(self) -> int:
        return _CONTEXT_MEMORY

    # -- execution ---------------------------------------------------------------------------------------
    def _problems(self) -> list[str]:
        problems = []
        for decl in self._engine.decls:
            if decl.is_input and self._input_shape(decl) is None:
                problems.append(f"input {decl.name!r} has no shape (set_input_shape since the profile was selected)")
            if not self._addresses.get(decl.name):
                problems.append(f"{decl.name!r} has no address (set_tensor_address)")
            if decl.alias is not None and self._addresses.get(decl.name) != self._addresses.get(decl.alias):
                problems.append(f"{decl.name!r} is not bound to {decl.alias!r}'s address: the plugins write the pool "
                                "in place, so bind both to one allocation as Edge-LLM's runtime does")
        if self._strategy is ExecutionContextAllocationStrategy.USER_MANAGED and (
                self._memory is None or self._memory[1] < _CONTEXT_MEMORY):
            problems.append(f"no context memory of {_CONTEXT_MEMORY} bytes (USER_MANAGED: set_device_memory)")
        return problems

    def _binding(self) -> list[tuple[_IO, int, Shape]]:
        """Every I/O's address and shape now (outputs resolved; a present_* output is skipped: it is its pool)."""
        out = []
        for decl in self._engine.decls:
            if decl.alias is not None:
                continue
            shape = self.get_tensor_shape(decl.name)
            out.append((decl, self._addresses[decl.name], shape))
        return out

    def execute_async_v3(self, stream_handle: int) -> bool:
        """Enqueue one step of the graph on ``stream_handle``; False (reasons logged) if the bindings are incomplete."""
        self.calls["execute_async_v3"] += 1
        problems = self._problems()
        if problems:
            for problem in problems:
                self._error("execute_async_v3", "%s", problem)
            return False
        binding = self._binding()
        for decl, _, shape in binding:
            if -1 in shape:
                self._error("execute_async_v3", "output %r has an unresolved shape %s", decl.name, shape)
                return False
        backend = self._engine.trtio_backend
        stream = int(stream_handle)
        if backend.is_host_accessible(Location.DEVICE):
            backend_host: Any = backend
            backend_host.launch_host_func(stream, lambda: self._compute(binding, None))
            return True
        with self._lock:
            if self._mirror is None:
                self._mirror = _Mirror(self._engine, backend)
            mirror = self._mirror
        if mirror.errors:
            raise mirror.errors.pop(0)
        mirror.enqueue(stream, binding, lambda: self._compute(binding, mirror), lambda: self._poison(binding, mirror))
        return True

    def _views(self, binding: list[tuple[_IO, int, Shape]], mirror: _Mirror | None) -> dict[str, np.ndarray]:
        """Numpy views of every I/O: the bound memory itself, or its host mirror."""
        host = None if mirror is None else mirror.mirrors(binding)
        return {decl.name: host_view(ptr if host is None else host[decl.name], _nbytes(decl, shape))
                .view(decl.dtype.storage_numpy).reshape(shape) for decl, ptr, shape in binding}

    def _compute(self, binding: list[tuple[_IO, int, Shape]], mirror: _Mirror | None) -> None:
        views = self._views(binding, mirror)
        inputs = {d.name: views[d.name] for d, _, _ in binding if d.is_input}
        results = self._engine.run_graph(inputs)
        for decl, _, shape in binding:
            if decl.is_input:
                continue
            value = np.asarray(results[decl.name])
            if value.shape != shape:
                raise InvalidValueError(f"{self.name}: execute_async_v3: the graph's {decl.name!r} is "
                                        f"{list(value.shape)}, the binding's shape {list(shape)}")
            views[decl.name][...] = value.astype(views[decl.name].dtype, copy=False)
        for decl in self._engine.decls:
            if decl.alias is not None and not np.shares_memory(np.asarray(results[decl.name]), views[decl.alias]):
                raise InvalidValueError(f"{self.name}: execute_async_v3: {decl.name!r} was not written into "
                                        f"{decl.alias!r} in place")

    def _poison(self, binding: list[tuple[_IO, int, Shape]], mirror: _Mirror) -> None:
        """NaN into the floating outputs' mirrors: a step whose computation failed must not look right."""
        views = self._views(binding, mirror)
        for decl, _, _ in binding:
            if not decl.is_input and views[decl.name].dtype.kind == "f":
                views[decl.name][...] = np.nan


class _Mirror:
    """Pinned host mirrors of every I/O of a context on the cuda backend, and the host function that computes.

    Bindings that share a device address (a KV-shared layer's pool is its donor's) share one mirror, so a later node
    of the step sees an earlier node's writes, as on the device. One ctypes callback serves every enqueue: its
    ``userData`` picks the computation of one binding snapshot (each I/O's address and shape), so a CUDA graph
    captured for that snapshot replays the same computation, and the callbacks stay bounded by the snapshots seen.
    A computation that fails (a plugin model refusing its inputs) leaves NaN in the floating outputs, which the
    copies back write over the bound outputs, and is raised at the context's next execute.
    """

    def __init__(self, engine: OnnxEngine, backend: Backend) -> None:
        # Tensors own the pinned bytes: freed with the context (their finalizers), or at once if one fails here.
        self._host = {name: Tensor.empty((max(nbytes, 1),), DType.UINT8, Location.PINNED, name=f"mirror:{name}",
                                         backend=backend)
                      for name, nbytes in _largest_bytes(engine).items()}
        self._backend = backend
        self._tasks: dict[int, tuple[Callable[[], None], Callable[[], None]]] = {}
        self._ids: dict[tuple[tuple[str, int, Shape], ...], int] = {}
        self.errors: list[BaseException] = []
        self._callback = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(self._run)

    def _run(self, user_data: Any) -> None:
        compute, poison = self._tasks[int(user_data or 0)]
        try:
            compute()
        except BaseException as exc:  # noqa: BLE001 - a host function cannot raise into CUDA
            self.errors.append(exc)
            log.error("OnnxEngine host function failed: %s", exc)
            poison()

    def mirrors(self, binding: list[tuple[_IO, int, Shape]]) -> dict[str, int]:
        """Each I/O's host mirror address: one mirror per distinct device address."""
        by_address: dict[int, int] = {}
        return {decl.name: by_address.setdefault(ptr, self._host[decl.name].data_ptr) for decl, ptr, _ in binding}

    def enqueue(self, stream: int, binding: list[tuple[_IO, int, Shape]], compute: Callable[[], None],
                poison: Callable[[], None]) -> None:
        key = tuple((decl.name, ptr, shape) for decl, ptr, shape in binding)
        task = self._ids.setdefault(key, len(self._ids))
        self._tasks[task] = (compute, poison)
        host = self.mirrors(binding)
        copied: set[int] = set()
        for decl, ptr, shape in binding:
            if decl.is_input and ptr not in copied:
                copied.add(ptr)
                self._backend.memcpy(host[decl.name], ptr, _nbytes(decl, shape), stream)
        launch = getattr(self._backend, "launch_host_func", None)
        if launch is not None:  # a host backend whose "device" memory the host cannot read (tests of this path)
            launch(stream, lambda: self._run(task))
        else:
            self._launch_cuda_host_func(stream, task)
        copied.clear()
        for decl, ptr, shape in binding:
            if (not decl.is_input or decl.name.startswith(_POOL_PREFIXES)) and ptr not in copied:
                copied.add(ptr)
                self._backend.memcpy(ptr, host[decl.name], _nbytes(decl, shape), stream)

    def _launch_cuda_host_func(self, stream: int, task: int) -> None:
        from cuda.bindings import runtime  # noqa: PLC0415 - the cuda backend imports it already

        address = ctypes.cast(self._callback, ctypes.c_void_p).value
        err = runtime.cudaLaunchHostFunc(stream, runtime.cudaHostFn_t(_ptr=address), task)[0]
        if err != runtime.cudaError_t.cudaSuccess:
            raise EngineError(f"cudaLaunchHostFunc failed: {err}")


def _nbytes(decl: _IO, shape: Shape) -> int:
    return int(np.prod(shape, dtype=np.int64)) * decl.dtype.storage_numpy.itemsize


def _largest_bytes(engine: OnnxEngine) -> dict[str, int]:
    """Each I/O's bytes at the profiles' largest shapes (outputs: their symbols at the inputs' largest extents)."""
    largest: dict[str, int] = {}
    symbols: dict[str, int] = {}
    for decl in engine.decls:
        if not decl.is_input:
            continue
        top = tuple(max(dims) for dims in zip(*(engine.profile(decl.name, i)[2]
                                                for i in range(engine.num_optimization_profiles))))
        for symbol, value in zip(decl.symbols, top):
            if symbol is not None:
                symbols[symbol] = max(symbols.get(symbol, 0), value)
        largest[decl.name] = int(np.prod(top, dtype=np.int64)) * decl.dtype.storage_numpy.itemsize
    for decl in engine.decls:
        if decl.is_input or decl.alias is not None:
            continue
        dims = [max(_dim(s, symbols), 0) if s is not None else d for s, d in zip(decl.symbols, decl.shape)]
        largest[decl.name] = int(np.prod(dims, dtype=np.int64)) * decl.dtype.storage_numpy.itemsize
    return largest
