"""Helpers for testing trtio, and runtimes built on it, without a GPU or TensorRT.

``ReferenceEngine`` implements the part of TensorRT's engine / context API trtio uses and computes a
tiny transformer (``docs/toy-model.md``) on the raw addresses it is given: numpy on the host backend,
CuPy on a GPU. ``greedy_generate`` and ``spec_generate`` are complete generation loops over trtio's
setups (token embedding, greedy sampling, EAGLE tree drafting); a loop of one's own can reuse their parts
(``embed_batch``, ``expand_level``, ``CandidateTree``, ``SpecStats``). ``FaultyBackend`` wraps a backend and
makes chosen calls fail, to test what a failure mid-step leaves behind (``docs/faults.md``).
``toy_engine_dir(name)`` is the path of a toy engine directory (``toy-llm-ragged``, ``toy-eagle3-ragged``, ...) in
TensorRT Edge-LLM's layout, from a source checkout or an installed wheel alike.
"""

from trtio.testing.async_host import AsyncHostBackend
from trtio.testing.faulty import FaultyBackend
from trtio.testing.reference_engine import ReferenceEngine
from trtio.testing.toy_dirs import toy_engine_dir
from trtio.testing.toy_model import ToyWeights, reference_forward, rope_table, toy_embedding
from trtio.testing.toy_runtime import (
    CandidateTree,
    SpecStats,
    embed_batch,
    expand_level,
    greedy_generate,
    spec_generate,
)

__all__ = [
    "AsyncHostBackend",
    "CandidateTree",
    "FaultyBackend",
    "ReferenceEngine",
    "SpecStats",
    "ToyWeights",
    "embed_batch",
    "expand_level",
    "greedy_generate",
    "reference_forward",
    "rope_table",
    "spec_generate",
    "toy_embedding",
    "toy_engine_dir",
]
