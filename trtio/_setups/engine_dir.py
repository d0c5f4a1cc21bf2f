"""create_from_engine_dir: a setup bound to the engines of an Edge-LLM 0.11 engine directory."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from types import ModuleType

from trtio._cuda.backend import Backend, get_backend
from trtio._pages import DEFAULT_MAX_PREFIXES
from trtio._setups.llm import LLMSetup, create_for_llm
from trtio._setups.spec_decode import SpecDecodeSetup, create_for_spec_decode
from trtio._setups.tensor_parallel import RankSpec, TensorParallelLLMSetup, check_devices
from trtio._stream import StreamLike
from trtio._trt import load_engine
from trtio.edgellm import EngineDir
from trtio.errors import ConfigError
from trtio.features import component_named

__all__ = ["create_from_engine_dir"]


def create_from_engine_dir(path: str | os.PathLike[str], stream: StreamLike = None, *, graphs: bool = False,
                           draft_top_k: int | None = None, draft_step: int | None = None,
                           verify_size: int | None = None, plugins: Sequence[str | os.PathLike[str]] = (),
                           module: str | ModuleType = "auto", backend: Backend | str | None = None,
                           devices: Sequence[int] | None = None,
                           checkpoint_dir: str | os.PathLike[str] | None = None,
                           max_prefixes: int = DEFAULT_MAX_PREFIXES, components: Sequence[str] | None = None,
                           ) -> LLMSetup | TensorParallelLLMSetup | SpecDecodeSetup:
    """An :class:`LLMSetup` (``llm.engine`` + ``config.json``, or a tensor-parallel ``config_world{N}.json`` +
    one engine per rank) or a :class:`SpecDecodeSetup` (``spec_base.engine`` + ``base_config.json``,
    ``spec_draft.engine`` + ``draft_config.json``) for the Edge-LLM directory at ``path``.

    The engines beside the LLM (the component table's: :mod:`trtio.components.component_table`) are bound and
    attached to the LLM's setup, on the same backend, with the same ``graphs``: a vision-language model's directory
    (a plain LLM with ``visual/``: Qwen2.5-VL, Qwen3-VL) gives the LLM's setup with its encoder attached as
    ``setup.visual`` (:func:`~trtio.create_for_visual` of ``visual/visual.engine``); a speech model's (``audio/``:
    Qwen3-ASR, Qwen3-Omni's thinker) with its audio encoder attached as ``setup.audio``
    (:func:`trtio.create_for_audio` of ``audio/audio_encoder.engine``). A folder holding an engine no component binds
    (Qwen3-Omni's ``talker/``, ``code_predictor/``, ``code2wav/``) is refused naming each, unless ``components``
    names what to open: ``components=("llm",)`` opens the LLM (or the speculative pair, or the ranks) alone,
    ``("llm", "visual", "audio")`` the LLM and its two encoders.

    A speculative pair needs ``draft_top_k``, ``draft_step`` and ``verify_size`` (Edge-LLM takes them at
    run time), checked against the configs' tree caps before any engine is loaded. Engines are
    deserialized with ``module`` after loading ``plugins`` and those ``EDGELLM_PLUGIN_PATH`` names
    (Edge-LLM's attention plugin).

    A tensor-parallel directory gives a :class:`~trtio._setups.tensor_parallel.TensorParallelLLMSetup` over its
    N ranks, rank r on ``devices[r]`` (default ``range(N)``; distinct local devices). Weight inputs its config
    leaves in the model's checkpoint (``checkpoint_weight_bindings``) are read once from ``checkpoint_dir``
    (default: the config's ``checkpoint_dir``), sliced per rank and bound as constant inputs. On GPUs
    (``backend`` "cuda", or "auto" where one answers) the ranks' NCCL communicators come from nccl4py
    (``trtio[tp]``) and are registered with the plugin library that exports
    ``edgellmRegisterNcclCommForAllReducePlugin`` (Edge-LLM's, among ``plugins``); on the host backend
    (``"host"``) the ranks all-reduce in process and ``devices`` are labels.

    ``max_prefixes``: a hybrid LLM's snapshot rows for pinned prefixes (see :func:`~trtio._setups.create_for_llm`).
    """
    directory = EngineDir.open(path, components=components)
    bundle = directory.deployment(draft_top_k, draft_step, verify_size)
    beside = directory.components
    if beside and (directory.kind != "llm" or directory.is_tensor_parallel):
        what = "a speculative pair" if directory.kind != "llm" else "a tensor-parallel LLM"
        name = next(iter(beside))
        component = component_named(name)
        assert component is not None
        raise ConfigError(component.FOLDER, f"{directory.path} holds {what} with a {component.WHAT}; "
                                            f"create_from_engine_dir attaches a {component.WHAT} to a plain LLM only "
                                            f"(bind it on its own, or open the directory with components=('llm',))")
    if directory.is_tensor_parallel:
        return _tensor_parallel(directory, stream, graphs=graphs, plugins=plugins, module=module, backend=backend,
                                devices=devices, checkpoint_dir=checkpoint_dir)
    for name, value in (("devices", devices), ("checkpoint_dir", checkpoint_dir)):
        if value is not None:
            raise ConfigError(name, f"is for a tensor-parallel directory (config_world{{N}}.json); {directory.path} "
                                    "holds one engine per role")
    if directory.kind == "llm":
        engine = load_engine(directory.engine_path("llm"), module, plugins=plugins)
        setup = create_for_llm(engine, directory.config, stream, graphs=graphs, backend=backend,
                               max_prefixes=max_prefixes)
        with contextlib.ExitStack() as undo:  # an engine beside it that fails to bind frees the LLM's setup
            undo.callback(setup.close)
            for name, cfg in beside.items():
                component = component_named(name)
                assert component is not None
                component.attach(setup, load_engine(directory.engine_path(name), module, plugins=plugins), cfg, stream,
                                 graphs=graphs)
            undo.pop_all()
        return setup
    base = load_engine(directory.engine_path("base"), module, plugins=plugins)
    draft = load_engine(directory.engine_path("draft"), module, plugins=plugins)
    return create_for_spec_decode(base, draft, bundle, stream=stream, graphs=graphs, backend=backend)


def _tensor_parallel(directory: EngineDir, stream: StreamLike, *, graphs: bool,
                     plugins: Sequence[str | os.PathLike[str]], module: str | ModuleType,
                     backend: Backend | str | None, devices: Sequence[int] | None,
                     checkpoint_dir: str | os.PathLike[str] | None) -> TensorParallelLLMSetup:
    kind = _backend_kind(backend)
    ranks = directory.tp_size
    found = check_devices(devices, ranks, kind if isinstance(kind, str) else "host")
    weights = directory.checkpoint_weights(checkpoint_dir)  # read once, before any device work
    specs = []
    for r in range(ranks):
        engine_file = directory.engine_path(r)

        def load(engine_file: os.PathLike[str] = engine_file) -> object:
            return load_engine(engine_file, module, plugins=plugins)

        specs.append(RankSpec(directory.rank_config(r), found[r], load, weights[r]))
    return TensorParallelLLMSetup(directory.config, specs, stream, backend=kind, graphs=graphs,
                                  plugins=[os.fspath(p) for p in plugins])


def _backend_kind(backend: Backend | str | None) -> str | Backend:
    """Where a tensor-parallel setup's ranks run: ``"cuda"``, ``"host"``, or a host Backend instance (every rank on
    it)."""
    if backend is None or backend == "auto":
        return get_backend("auto").name
    if backend in ("cuda", "host"):
        return str(backend)
    if isinstance(backend, Backend) and backend.name != "cuda":
        return backend
    raise ConfigError("backend", f"a tensor-parallel directory runs on 'cuda' (one device per rank, each rank's "
                                 f"backend made by trtio), 'host' or a host Backend instance, got {backend!r}")
