"""The types a runtime meets that are not in ``trtio.__all__``: what the setups return or take (a pinned prefix, the
KV pages of a sequence, a directory's token embeddings, an encoder's output, the memory and graph reports, the
backend protocol, the step shapes), re-exported from their implementation modules, which are private and not kept
stable. Import them from here (a speech model's are :mod:`trtio.audio`'s). Nothing but re-exports (the API pages,
docs/api/, document each here)."""

from __future__ import annotations

from trtio._cuda.backend import Backend, cuda_available
from trtio._dims import InferenceDims
from trtio._embeddings import TokenEmbeddings
from trtio._engine import GraphStats
from trtio._memory import MemoryReport
from trtio._pages import Prefix
from trtio._rope import RopeScaling
from trtio._setups.base import EngineGraphStats
from trtio._setups.binding import BoundEngine
from trtio._setups.sequences import KVPages
from trtio._setups.spec_decode import Phase
from trtio._stream import StreamLike, SupportsCudaStream
from trtio.components.visual.visual_config import VisualConfig
from trtio.components.visual.visual_setup import VisualOutput

__all__ = ["Backend", "BoundEngine", "EngineGraphStats", "GraphStats", "InferenceDims", "KVPages", "MemoryReport",
           "Phase", "Prefix", "RopeScaling", "StreamLike", "SupportsCudaStream", "TokenEmbeddings", "VisualConfig",
           "VisualOutput", "cuda_available"]
