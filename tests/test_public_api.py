"""trtio's public surface: ``trtio.__all__`` holds what a user constructs, passes or catches; the internals
stay importable from their own modules."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import trtio

INTERNALS = {  # module -> names a user never needs from the facade
    "trtio.memory": ["Arena", "TensorRequest", "MemoryEntry"],
    "trtio.staging": ["UploadRing", "StepStaging"],
    "trtio.engine": ["ContextMemory", "EngineExecutor", "TensorInfo"],
    "trtio.state": ["EngineState"],
    "trtio.registry": ["TensorRegistry", "TensorSpec"],
    "trtio.contracts": ["build_registry"],
    "trtio.dims": ["InferenceDims"],
}


def test_every_public_name_resolves_and_none_is_listed_twice() -> None:
    assert len(set(trtio.__all__)) == len(trtio.__all__)
    for name in trtio.__all__:
        assert getattr(trtio, name) is not None, name


def test_what_a_runtime_needs_is_public() -> None:
    for name in ("create_for_llm", "create_for_spec_decode", "create_from_engine_dir", "LLMSetup", "SpecDecodeSetup",
                 "BoundEngine", "check_engine", "StreamLike", "Prefix", "KVPages", "Tensor", "Stream", "TrtioError",
                 "CapacityError"):
        assert name in trtio.__all__, name


def test_internals_stay_in_their_modules() -> None:
    for module, found in INTERNALS.items():
        mod = importlib.import_module(module)
        for name in found:
            assert name not in trtio.__all__ and not hasattr(trtio, name), f"trtio.{name} is internal"
            assert getattr(mod, name) is not None, f"{module}.{name} stays importable"


def test_the_facade_only_reexports() -> None:
    tree = ast.parse((Path(trtio.__file__)).read_text(encoding="utf-8"))
    defined = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))]
    assert not defined, "trtio/__init__.py defines nothing of its own"
