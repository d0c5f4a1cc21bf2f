"""Helpers for testing trtio, and runtimes built on it, without a GPU or TensorRT.

``ReferenceEngine`` implements the part of TensorRT's engine / context API trtio uses and computes a
tiny transformer (``docs/toy-model.md``) on the raw addresses it is given: numpy on the host backend,
CuPy on a GPU.
"""

from trtio.testing.reference_engine import ReferenceEngine
from trtio.testing.toy_model import ToyWeights, reference_forward, rope_table, toy_embedding

__all__ = ["ReferenceEngine", "ToyWeights", "reference_forward", "rope_table", "toy_embedding"]
