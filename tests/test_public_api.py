"""trtio's public surface: ``trtio.__all__`` holds what a user calls, passes or catches (at most 30 names); the
internals stay importable from their own modules; ``import trtio`` is quick and imports no optional package."""

from __future__ import annotations

import ast
import importlib
import inspect
import subprocess
import sys
from pathlib import Path

import trtio
import trtio.testing

INTERNALS = {  # module -> names a user never needs from the facade
    "trtio._memory": ["Arena", "TensorRequest", "MemoryEntry", "MemoryReport"],
    "trtio._staging": ["UploadRing", "StepStaging"],
    "trtio._engine": ["ContextMemory", "EngineExecutor", "TensorInfo", "EngineIO", "GraphStats"],
    "trtio._state": ["EngineState"],
    "trtio._registry": ["TensorRegistry", "TensorSpec"],
    "trtio._contracts": ["build_registry"],
    "trtio._dims": ["InferenceDims"],
    "trtio._pipeline_io": ["StreamingPrefillBuffers"],
    "trtio._tensor_map": ["TensorMap"],
    "trtio._setups.binding": ["BoundEngine", "check_engine"],
    "trtio._setups.base": ["EngineGraphStats"],
    "trtio._setups.sequences": ["KVPages"],
    "trtio._pages": ["Prefix"],
    "trtio._stream": ["StreamLike"],
    "trtio._cuda.backend": ["Backend", "cuda_available"],
    "trtio._trt": ["load_plugins"],
}

# Names the design shows as ``trtio.<name>`` that are not in __all__: they stay attributes of the package.
DOCUMENTED_ATTRIBUTES = ["contract_of", "Event", "edgellm", "names", "ExportError", "InvalidTypeError",
                         "InvalidValueError", "UnknownNameError", "create_for_audio", "audio"]

# Python's own modules that ``import trtio`` may not pull in: optional packages are imported where used.
OPTIONAL = ["ml_dtypes", "tokenizers", "torch", "cupy", "jax", "tensorrt", "tensorrt_rtx", "cuda.bindings",
            "safetensors", "nccl", "hypothesis"]


def test_every_public_name_resolves_and_none_is_listed_twice() -> None:
    assert len(set(trtio.__all__)) == len(trtio.__all__)
    for name in trtio.__all__:
        assert getattr(trtio, name) is not None, name


def test_the_facade_lists_at_most_30_names_and_no_module() -> None:
    assert len(trtio.__all__) <= 30, f"{len(trtio.__all__)} names in trtio.__all__"
    modules = [name for name in trtio.__all__ if inspect.ismodule(getattr(trtio, name))]
    assert not modules, f"modules in trtio.__all__: {modules}"


def test_what_a_runtime_needs_is_public() -> None:
    for name in ("create_for_llm", "create_for_spec_decode", "create_from_engine_dir", "LLMSetup", "SpecDecodeSetup",
                 "TensorParallelLLMSetup", "load_engine", "EngineDir", "Tensor", "Stream", "TrtioError",
                 "CapacityError", "NotAvailableError"):
        assert name in trtio.__all__, name


def test_the_seeds_class_is_public() -> None:
    """``trtio.PipelineIO``, the seed's class and the first name of the design card, is in ``__all__`` (DESIGN
    §18): the class of a setup's buffers (its ``io``)."""
    from trtio._pipeline_io import PipelineIO
    from trtio.testing.toy_engines import RaggedToyEngines

    assert "PipelineIO" in trtio.__all__ and trtio.PipelineIO is PipelineIO
    toys = RaggedToyEngines.load()
    with trtio.create_for_llm(toys.reference_engine("toy-llm-ragged", device="host"), toys.llm_config) as setup:
        assert type(setup.io) is trtio.PipelineIO
    namespace: dict[str, object] = {}
    exec("from trtio import *", namespace)
    assert namespace["PipelineIO"] is PipelineIO


def test_what_create_from_engine_dir_returns_for_a_tensor_parallel_directory_is_public() -> None:
    from trtio._setups.tensor_parallel import TensorParallelLLMSetup

    assert trtio.TensorParallelLLMSetup is TensorParallelLLMSetup
    # LLMSetup's step API, by composition: the same calls with the same parameters, the same views
    for name in ("prefill", "decode", "release", "pin_prefix", "reset", "populate_streaming", "memory_report"):
        mine, theirs = (inspect.signature(getattr(c, name)) for c in (TensorParallelLLMSetup, trtio.LLMSetup))
        assert list(mine.parameters) == list(theirs.parameters), name
    for name in ("active", "lengths", "batch", "kv_pages", "state", "executor", "tensor_map", "graph_stats",
                 "rope_deltas", "decode_planned", "is_broken", "contract", "is_closed", "close", "engines"):
        assert hasattr(TensorParallelLLMSetup, name), name


def test_names_the_design_shows_stay_attributes() -> None:
    for name in DOCUMENTED_ATTRIBUTES:
        assert name not in trtio.__all__, name
        assert getattr(trtio, name) is not None, name
    assert trtio.edgellm.EngineDir is trtio.EngineDir
    assert trtio.names.kLogits == "logits"
    from trtio import errors

    for name, value in vars(errors).items():
        if isinstance(value, type) and issubclass(value, errors.TrtioError):
            assert getattr(trtio, name) is value, f"trtio.{name}"


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


# The public modules (docs/architecture.md, "The public API"): the facade, the documented modules, and the seam a
# family's author writes against (DESIGN §18). Every other module's path has an underscore-led part.
DOCUMENTED = ("trtio.testing", "trtio.edgellm", "trtio.vision", "trtio.audio", "trtio.names", "trtio.errors",
              "trtio.families", "trtio.types")
SEAM = ("trtio.features", "trtio.families", "trtio.components")


def _public_modules(package: Path) -> list[str]:
    """Every module under ``package`` (a trtio folder) none of whose dotted parts starts with an underscore."""
    out = []
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] in ("__init__", "__main__"):
            parts.pop()
        if not any(p.startswith("_") for p in parts):
            out.append(".".join(parts))
    return out


def _not_listed(package: Path) -> list[str]:
    def listed(module: str) -> bool:
        return module == "trtio" or any(module == m or module.startswith(m + ".") for m in (*DOCUMENTED, *SEAM))
    return [m for m in _public_modules(package) if not listed(m)]


def test_every_module_is_public_by_design_or_private_by_name() -> None:
    """``trtio.__all__`` plus the documented modules (and the seam) are public; every other module is private by its
    name (an underscore-led part: ``trtio._setups.llm``, ``trtio._engine``)."""
    assert _not_listed(Path(trtio.__file__).parent) == []


def test_the_surface_check_sees_a_public_module_nobody_documented(tmp_path: Path) -> None:
    package = tmp_path / "trtio"
    for name in ("__init__.py", "errors.py", "_engine.py", "_setups/__init__.py", "_setups/llm.py", "helpers.py",
                 "families/gemma4/swa.py", "plans/__init__.py"):
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text("")
    assert _not_listed(package) == ["trtio.helpers", "trtio.plans"]


def test_the_architecture_page_lists_the_documented_modules() -> None:
    page = (Path(trtio.__file__).parents[1] / "docs" / "architecture.md").read_text(encoding="utf-8")
    api = page[page.index("## The public API"):page.index("## Contracts")]
    missing = [m for m in DOCUMENTED if f"`{m}`" not in api]
    assert missing == [], f"docs/architecture.md's public API does not name {missing}"


def test_the_types_module_exports_what_the_api_pages_document() -> None:
    """The API pages (docs/api/types.rst, and trtio.rst for EngineDir's embeddings) document the types a runtime meets
    at trtio.types: it re-exports exactly those."""
    import re

    import trtio.types

    pages = (Path(trtio.__file__).parents[1] / "docs" / "api").glob("*.rst")
    documented = sorted(name for page in pages for name in re.findall(
        r"^\.\. auto\w+:: trtio\.types\.(\w+)$", page.read_text(encoding="utf-8"), re.M))
    assert documented == sorted(trtio.types.__all__)
    for name in trtio.types.__all__:
        assert getattr(trtio.types, name) is not None, name


def test_no_api_page_documents_a_private_module() -> None:
    """docs/api/ documents what is public: no autodoc directive names a path with an underscore-led part."""
    import re

    pages = (Path(trtio.__file__).parents[1] / "docs" / "api").glob("*.rst")
    private = [f"{page.name}: {target}" for page in pages for target in re.findall(
        r"^\.\. auto\w+:: (trtio\.[\w.]+)", page.read_text(encoding="utf-8"), re.M)
        if any(part.startswith("_") for part in target.split("."))]
    assert private == []


def test_the_testing_module_lists_what_it_exports() -> None:
    assert len(set(trtio.testing.__all__)) == len(trtio.testing.__all__)
    for name in trtio.testing.__all__:
        assert getattr(trtio.testing, name) is not None, name


def test_import_trtio_pulls_in_no_optional_package() -> None:
    """Every command and program pays for ``import trtio``: optional packages (ml_dtypes alone took 0.4 s) are
    imported where they are used, and bf16 still has its numpy type once something asks for it."""
    code = ("import sys, trtio\n"
            f"print(sorted(m for m in {OPTIONAL!r} if m in sys.modules))\n"
            "import trtio._cli, trtio.testing\n"
            f"print(sorted(m for m in {OPTIONAL!r} if m in sys.modules))\n"
            "print(trtio.DType.BFLOAT16.numpy)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(trtio.__file__).parents[1]).stdout.splitlines()
    assert out[0] == "[]", f"import trtio imported {out[0]}"
    assert out[1] == "[]", f"import trtio._cli / trtio.testing imported {out[1]}"
    try:
        import ml_dtypes  # noqa: F401
    except ImportError:  # pragma: no cover - where ml_dtypes is absent bf16 has no numpy type
        assert out[2] == "None"
    else:
        assert out[2] == "bfloat16"
