"""trtio: pointer-stable TensorRT binding manager for LLM inference.

``import trtio`` works with no GPU, no CUDA driver and no TensorRT: cuda-python and TensorRT
are imported only when a backend or engine needs them.
"""

from trtio import names
from trtio.cuda.backend import Backend, Location, cuda_available, get_backend
from trtio.dtypes import DType
from trtio.errors import (
    BindingError,
    CapacityError,
    ClosedError,
    ConfigError,
    CudaError,
    EngineError,
    FrozenError,
    ShapeError,
    TrtioError,
)
from trtio.memory import Arena, MemoryEntry, MemoryReport, TensorRequest
from trtio.stream import Event, Stream
from trtio.tensor import Tensor

__version__ = "0.1.0"

__all__ = [
    "Arena",
    "Backend",
    "BindingError",
    "CapacityError",
    "ClosedError",
    "ConfigError",
    "CudaError",
    "DType",
    "EngineError",
    "Event",
    "FrozenError",
    "Location",
    "MemoryEntry",
    "MemoryReport",
    "ShapeError",
    "Stream",
    "Tensor",
    "TensorRequest",
    "TrtioError",
    "cuda_available",
    "get_backend",
    "names",
]
