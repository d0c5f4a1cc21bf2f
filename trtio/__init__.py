"""trtio: pointer-stable TensorRT binding manager for LLM inference.

``import trtio`` works with no GPU, no CUDA driver and no TensorRT: cuda-python, TensorRT and the optional
packages (ml_dtypes, tokenizers, torch, ...) are imported only when something needs them.

``__all__`` is what a user calls, passes or catches: the factories and the setups they return, ``PipelineIO`` (the
seed's class, Edge-LLM's ``PipelineIO`` in Python: the worst-case buffers a setup binds, its ``io``), engine
loading, the configs, tensors, streams and backends, and the errors worth catching one by one. Everything else stays
importable from its own module (``trtio._engine.EngineIO``, ``trtio._setups.binding.BoundEngine``, ...);
``docs/architecture.md`` maps the modules. A few names that are not
in ``__all__`` stay attributes of the package because the design documents them as ``trtio.<name>``:
``trtio.contract_of``, ``trtio.Event``, ``trtio.create_for_audio`` (a speech model's audio encoder: DESIGN §19),
every error class of :mod:`trtio.errors`, and the modules ``trtio.edgellm``, ``trtio.names``, ``trtio.vision`` and
``trtio.audio``.
"""

import logging as _logging

# `X as X`: an attribute of the package that is not in __all__ (see above).
from trtio import audio as audio
from trtio import edgellm as edgellm
from trtio import names as names
from trtio import vision as vision
from trtio._config import DeploymentConfig, LLMEngineConfig, SpecDecodeConfig
from trtio._contracts import contract_of as contract_of
from trtio._cuda.backend import Location, get_backend
from trtio._dtypes import DType
from trtio._pipeline_io import PipelineIO
from trtio._setups import (
    LLMSetup,
    SpecDecodeSetup,
    create_for_llm,
    create_for_spec_decode,
    create_from_engine_dir,
)
from trtio._setups.tensor_parallel import TensorParallelLLMSetup
from trtio._stream import Event as Event
from trtio._stream import Stream
from trtio._tensor import Tensor
from trtio._trt import load_engine

# The family and component tables: they register every family and component with trtio.features, before any
# config is read (no module builds one at import time).
from trtio.components import component_table as _component_table  # noqa: F401
from trtio.components.audio.audio_setup import create_for_audio as create_for_audio
from trtio.components.visual.visual_setup import VisualSetup, create_for_visual
from trtio.edgellm import EngineDir
from trtio.errors import (
    BindingError,
    CapacityError,
    ClosedError,
    ConfigError,
    CudaError,
    EngineError,
    FrozenError,
    NotAvailableError,
    ShapeError,
    TrtioError,
)
from trtio.errors import ExportError as ExportError
from trtio.errors import InvalidTypeError as InvalidTypeError
from trtio.errors import InvalidValueError as InvalidValueError
from trtio.errors import UnknownNameError as UnknownNameError
from trtio.families import family_table as _family_table  # noqa: F401
from trtio.families.lora.adapters import LoraAdapter

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
    "TensorParallelLLMSetup",
    "VisualSetup",
    # the seed's class: every buffer a pipeline binds, allocated once at worst case (a setup's io)
    "PipelineIO",
    # engines and their directories
    "load_engine",
    "EngineDir",
    "LoraAdapter",
    # configs
    "LLMEngineConfig",
    "SpecDecodeConfig",
    "DeploymentConfig",
    # tensors, streams and backends
    "Tensor",
    "DType",
    "Location",
    "Stream",
    "get_backend",
    # errors
    "TrtioError",
    "BindingError",
    "CapacityError",
    "ClosedError",
    "ConfigError",
    "CudaError",
    "EngineError",
    "FrozenError",
    "NotAvailableError",
    "ShapeError",
]

