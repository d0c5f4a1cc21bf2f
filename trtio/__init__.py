"""trtio: pointer-stable TensorRT binding manager for LLM inference.

``import trtio`` works with no GPU, no CUDA driver and no TensorRT: cuda-python and TensorRT
are imported only when a backend or engine needs them.
"""

import logging as _logging

from trtio import edgellm, names
from trtio.config import DeploymentConfig, LLMEngineConfig, SpecDecodeConfig
from trtio.contracts import build_registry, contract_of
from trtio.cuda.backend import Backend, Location, cuda_available, get_backend
from trtio.dims import InferenceDims
from trtio.dtypes import DType
from trtio.edgellm import EngineDir
from trtio.engine import ContextMemory, EngineExecutor, EngineIO, GraphStats, TensorInfo
from trtio.errors import (
    BindingError,
    CapacityError,
    ClosedError,
    ConfigError,
    CudaError,
    EngineError,
    FrozenError,
    InvalidTypeError,
    InvalidValueError,
    ShapeError,
    TrtioError,
    UnknownNameError,
)
from trtio.memory import Arena, HostStaging, MemoryEntry, MemoryReport, TensorRequest
from trtio.pipeline_io import PipelineIO, StreamingPrefillBuffers
from trtio.registry import TensorRegistry, TensorSpec
from trtio.setups import LLMSetup, SpecDecodeSetup, create_for_llm, create_for_spec_decode, create_from_engine_dir
from trtio.state import EngineState
from trtio.stream import Event, Stream
from trtio.tensor import Tensor
from trtio.tensor_map import TensorMap
from trtio.trt import load_engine, load_plugins

__version__ = "0.1.0"

# A library logs and lets the application decide where it goes (TensorRT's log arrives under trtio.trt).
_logging.getLogger("trtio").addHandler(_logging.NullHandler())

__all__ = [
    "ContextMemory",
    "EngineExecutor",
    "EngineIO",
    "EngineState",
    "GraphStats",
    "LLMSetup",
    "SpecDecodeSetup",
    "TensorInfo",
    "create_for_llm",
    "create_for_spec_decode",
    "create_from_engine_dir",
    "load_engine",
    "load_plugins",
    "EngineDir",
    "edgellm",
    "Arena",
    "Backend",
    "BindingError",
    "CapacityError",
    "ClosedError",
    "ConfigError",
    "CudaError",
    "DType",
    "DeploymentConfig",
    "EngineError",
    "Event",
    "FrozenError",
    "InvalidTypeError",
    "InvalidValueError",
    "UnknownNameError",
    "HostStaging",
    "InferenceDims",
    "LLMEngineConfig",
    "Location",
    "MemoryEntry",
    "MemoryReport",
    "PipelineIO",
    "ShapeError",
    "SpecDecodeConfig",
    "Stream",
    "StreamingPrefillBuffers",
    "Tensor",
    "TensorMap",
    "TensorRegistry",
    "TensorRequest",
    "TensorSpec",
    "TrtioError",
    "cuda_available",
    "build_registry",
    "contract_of",
    "get_backend",
    "names",
]
