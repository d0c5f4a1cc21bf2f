"""Helpers for testing trtio, and runtimes built on it, without a GPU or TensorRT.

``ReferenceEngine`` implements the part of TensorRT's engine / context API trtio uses and computes a
tiny transformer (``docs/toy-model.md``) on the raw addresses it is given: numpy on the host backend,
CuPy on a GPU. ``greedy_generate`` and ``spec_generate`` are complete generation loops over trtio's
setups (token embedding, greedy sampling, EAGLE tree drafting); a loop of one's own can reuse their parts
(``embed_batch``, ``expand_level``, ``CandidateTree``, ``SpecStats``). ``FaultyBackend`` wraps a backend and
makes chosen calls fail, to test what a failure mid-step leaves behind (``docs/faults.md``).
``OnnxEngine`` runs the graph NVIDIA's Edge-LLM exporter wrote for a model (Edge-LLM's plugins as numpy models
written from its C++, :mod:`trtio.testing.edgellm_plugins`) as a TensorRT engine, so a runtime built on trtio can be
checked against Hugging Face's logits on a CPU (``docs/guide/parity.md``).
``toy_engine_dir(name)`` is the path of a toy engine directory (``toy-llm-ragged``, ``toy-eagle3-ragged``, ...) in
TensorRT Edge-LLM's layout, from a source checkout or an installed wheel alike.
"""

from trtio.testing.async_host import AsyncHostBackend
from trtio.testing.faulty import FaultyBackend
from trtio.testing.onnx_engine import OnnxEngine
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
    "OnnxEngine",
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
