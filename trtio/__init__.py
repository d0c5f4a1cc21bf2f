"""trtio: pointer-stable TensorRT binding manager for LLM inference.

``import trtio`` works with no GPU, no CUDA driver and no TensorRT: cuda-python and TensorRT
are imported only when a backend or engine needs them.

This module re-exports what a user of trtio constructs, passes or catches; everything else stays
importable from its own module (``trtio.memory.Arena``, ``trtio.engine.EngineExecutor``, ...).
``docs/architecture.md`` maps the modules.
"""

import logging as _logging

from trtio import edgellm, names, vision
from trtio.config import DeploymentConfig, LLMEngineConfig, SpecDecodeConfig
from trtio.contracts import contract_of
from trtio.cuda.backend import Backend, Location, cuda_available, get_backend
from trtio.dtypes import DType
from trtio.edgellm import EngineDir
from trtio.engine import EngineIO, GraphStats
from trtio.errors import (
    BindingError,
    CapacityError,
    ClosedError,
    ConfigError,
    CudaError,
    EngineError,
    ExportError,
    FrozenError,
    InvalidTypeError,
    InvalidValueError,
    NotAvailableError,
    ShapeError,
    TrtioError,
    UnknownNameError,
)
from trtio.memory import MemoryReport
from trtio.pages import Prefix
from trtio.pipeline_io import PipelineIO, StreamingPrefillBuffers
from trtio.setups import (
    BoundEngine,
    LLMSetup,
    SpecDecodeSetup,
    VisualOutput,
    VisualSetup,
    check_engine,
    create_for_llm,
    create_for_spec_decode,
    create_for_visual,
    create_from_engine_dir,
)
from trtio.setups.base import EngineGraphStats
from trtio.setups.sequences import KVPages
from trtio.stream import Event, Stream, StreamLike
from trtio.tensor import Tensor
from trtio.tensor_map import TensorMap
from trtio.trt import load_engine, load_plugins
from trtio.visual_config import VisualConfig

__version__ = "0.1.0"

# A library logs and lets the application decide where it goes (TensorRT's log arrives under trtio.trt).
_logging.getLogger("trtio").addHandler(_logging.NullHandler())

__all__ = [
    # setups: what a runtime creates and steps
    "create_for_llm",
    "create_for_spec_decode",
    "create_from_engine_dir",
    "create_for_visual",
    "LLMSetup",
    "SpecDecodeSetup",
    "VisualSetup",
    "VisualOutput",
    "VisualConfig",
    "vision",
    "BoundEngine",
    "check_engine",
    "EngineGraphStats",
    "GraphStats",
    "KVPages",
    "Prefix",
    # engines and their directories
    "EngineIO",
    "EngineDir",
    "contract_of",
    "load_engine",
    "load_plugins",
    "edgellm",
    "names",
    # configs
    "LLMEngineConfig",
    "SpecDecodeConfig",
    "DeploymentConfig",
    # buffers, streams and backends
    "PipelineIO",
    "StreamingPrefillBuffers",
    "TensorMap",
    "Tensor",
    "DType",
    "Location",
    "MemoryReport",
    "Stream",
    "StreamLike",
    "Event",
    "Backend",
    "get_backend",
    "cuda_available",
    # errors
    "TrtioError",
    "BindingError",
    "CapacityError",
    "ClosedError",
    "ConfigError",
    "CudaError",
    "EngineError",
    "ExportError",
    "FrozenError",
    "InvalidTypeError",
    "InvalidValueError",
    "NotAvailableError",
    "ShapeError",
    "UnknownNameError",
]
