"""The toy engine set of ``engines/``: its configs, weights, reference engines and built plans.

``engines/`` holds two deployments of one tiny transformer (``docs/toy-model.md``) for each of trtio's
two engine contracts. The batch-major toy contract (:class:`ToyEngines`):

* ``toy-llm/config.json`` — a :class:`~trtio.DeploymentConfig` with only ``base``, a plain LLM;
* ``toy-eagle/config.json`` — the same model as a spec-decode ``base``, an EAGLE ``draft`` and the
  ``spec`` section; ``toy-eagle/base/config.json`` and ``toy-eagle/draft/config.json`` repeat each
  engine's :class:`~trtio.LLMEngineConfig` for the plans built beside them.

Both carry ``"seed"``: the weights are ``ToyWeights.generate(base, seed)`` for toy-llm and
toy-eagle's base (the same numbers: one model) and ``ToyWeights.generate_draft(draft, base weights,
seed)`` for the draft, so speculative decoding must reproduce toy-llm's greedy tokens.

A built engine directory (``scripts/build_toy_engines.py --out DIR``) has the same layout with a
``model.plan`` beside each engine's ``config.json`` (``toy-llm``, ``toy-eagle/base``,
``toy-eagle/draft``); :meth:`ToyEngines.load` reads either.

Edge-LLM 0.11's token-major ("ragged") contract with a paged KV cache (:class:`RaggedToyEngines`), in
Edge-LLM's own directory layout and config format (``builder_config`` and all), so that every path a
real engine directory takes is exercised:

* ``toy-llm-ragged/config.json`` — a plain LLM (4 layers);
* ``toy-eagle3-ragged/base_config.json`` + ``draft_config.json`` — the same model as an EAGLE3 base
  (hidden states of layers 0, 1 and 3 feed the draft) and an EAGLE3 draft with the base's 4 layers.

Edge-LLM's configs have no seed: the weights are ``ToyWeights.generate(cfg, 0)`` for the LLM and the
base (one model) and ``ToyWeights.generate_draft(draft, base weights, 0)`` for the draft. No plans of
this contract are built here (Edge-LLM's builder and attention plugin make real ones); the engines
are :class:`~trtio.testing.ReferenceEngine` s.

A vision-language model in Edge-LLM's layout of a Qwen3-VL build (:class:`VisionToyEngines`):
``toy-vlm-ragged/config.json`` (an LLM of the ragged toy's kind with interleaved MRoPE and three deepstack
features) and ``toy-vlm-ragged/visual/`` (a Qwen3-VL ViT's ``config.json`` and ``preprocessor_config.json``),
whose engines are a :class:`~trtio.testing.ReferenceEngine` and a
:class:`~trtio.testing.reference_visual.ReferenceVisualEngine`.

The same model built tensor-parallel (:class:`TensorParallelToyEngines`), in Edge-LLM's layout of such a
build: ``toy-llm-tp2/config_world2.json`` and ``toy-llm-tp4/config_world4.json`` (one engine per rank, each
with its share of the heads and of the MLP), whose engines read the LM head and each layer's MLP down
projection (split across ranks) from ``toy-checkpoint/model.safetensors`` (``checkpoint_weight_bindings``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, TextIO

import numpy as np

from trtio._config import DeploymentConfig, LLMEngineConfig
from trtio.edgellm import EngineDir
from trtio.errors import ConfigError, UnknownNameError
from trtio.families.hybrid.hybrid_config import HybridConfig
from trtio.testing.toy_dirs import default_engines_dir, plan_cache_dir
from trtio.testing.toy_model import ToyWeights, toy_embedding

__all__ = ["ENGINE_NAMES", "HYBRID_DIRS", "RAGGED_DEMO_TREE", "RAGGED_DIRS", "RAGGED_ENGINE_NAMES", "RAGGED_SEED",
           "TP_DIRS", "VLM_DIR", "HybridToyEngine", "RaggedToyEngines", "TensorParallelToyEngines", "ToyEngines",
           "VisionToyEngines",
           "default_engines_dir", "plan_cache_dir"]

#: The toy engines, in build order: directory names under an engines folder.
ENGINE_NAMES = ("toy-llm", "toy-eagle/base", "toy-eagle/draft")
#: The ragged toy engine directories (Edge-LLM layout) under an engines folder: plain LLM, EAGLE3 pair.
RAGGED_DIRS = ("toy-llm-ragged", "toy-eagle3-ragged")
#: The ragged toy engines by name: ``<directory>`` for the LLM, ``<directory>/<role>`` for the pair.
RAGGED_ENGINE_NAMES = ("toy-llm-ragged", "toy-eagle3-ragged/base", "toy-eagle3-ragged/draft")
#: The weights' seed of the ragged toys (Edge-LLM's configs have no seed key).
RAGGED_SEED = 0
#: The tensor-parallel toy directories (Edge-LLM's ``config_world{N}.json`` layout): toy-llm-ragged's model
#: across 2 and 4 ranks, with the checkpoint their engines read weights from.
TP_DIRS = ("toy-llm-tp2", "toy-llm-tp4")
#: The hybrid toy directories (Edge-LLM layout, ragged contract): a Gated-DeltaNet model like Qwen3.5's (4 recurrent
#: and 2 attention layers) and a Mamba2 model like Nemotron-H's (3 recurrent layers and one attention layer without
#: RoPE; its MLP blocks are absent from layer_types), both with toy-llm-ragged's vocabulary and hidden size.
HYBRID_DIRS = ("toy-qwen35-ragged", "toy-nemotron-h-ragged")

#: The toy vision-language model directory (Edge-LLM's layout of a Qwen3-VL build: the LLM and ``visual/``).
VLM_DIR = "toy-vlm-ragged"
#: The run-time tree of the ragged pair's demo: (draft_top_k, draft_step, verify_size), within the
#: configs' caps (max_draft_tree_size 8 >= 2 x 3, max_verify_tree_size 8).
RAGGED_DEMO_TREE = (2, 3, 8)
# What the weights and the computation depend on: fields the LLM and the pair's base must agree on.
_MODEL_FIELDS = ("hidden_size", "vocab_size", "output_vocab_size", "num_attention_layers", "num_attention_heads",
                 "num_kv_heads", "head_dim", "rotary_dim", "rope_theta", "rope_type", "rope_scaling",
                 "activation_dtype", "kv_cache_dtype", "num_deepstack_features", "max_supported_batch_size",
                 "max_supported_input_length", "max_kv_cache_capacity", "kv_page_size", "kv_pool_pages")
PLAN_FILE = "model.plan"
CONFIG_FILE = "config.json"


def _field_diff(a: Any, b: Any) -> str:
    """``hidden_size 64 vs 32, ...`` for two configs of one dataclass type."""
    diffs = [f"{f.name} {getattr(a, f.name)!r} vs {getattr(b, f.name)!r}"
             for f in dataclasses.fields(a) if f.compare and getattr(a, f.name) != getattr(b, f.name)]
    return ", ".join(diffs) or "no field differs"


@dataclass(frozen=True)
class ToyEngines:
    """The two toy deployments read from one engines folder (see module docstring)."""

    llm: DeploymentConfig
    eagle: DeploymentConfig
    root: Path
    _weights: dict[str, ToyWeights] = field(default_factory=dict, compare=False, repr=False)

    # -- loading ----------------------------------------------------------------------------------
    @classmethod
    def load(cls, root: str | os.PathLike[str] | None = None) -> ToyEngines:
        """Read ``root/toy-llm/config.json`` and ``root/toy-eagle/config.json`` (and, where present, the
        per-engine configs under ``toy-eagle/``) and check that they describe one model.

        Raises :class:`~trtio.ConfigError` naming the file and the fields that disagree.
        """
        root = Path(root) if root is not None else default_engines_dir()
        llm_path, eagle_path = root / "toy-llm" / CONFIG_FILE, root / "toy-eagle" / CONFIG_FILE
        llm = DeploymentConfig.from_json(llm_path)
        eagle = DeploymentConfig.from_json(eagle_path)
        if llm.draft is not None or llm.base.role != "llm":
            raise ConfigError(f"{llm_path}.base", "toy-llm must be a plain LLM: only a base with "
                                                  "is_spec_decode_base false, no draft or spec")
        if eagle.draft is None:
            raise ConfigError(f"{eagle_path}.draft", "toy-eagle needs a base, a draft and a spec section")
        for path, dep in ((llm_path, llm), (eagle_path, eagle)):
            seed = dep.extra.get("seed", 0)
            if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
                raise ConfigError(f"{path}.seed", f"must be a non-negative int, got {seed!r}")
        if llm.extra.get("seed", 0) != eagle.extra.get("seed", 0):
            raise ConfigError(f"{eagle_path}.seed", f"{eagle.extra.get('seed', 0)} differs from toy-llm's "
                                                    f"{llm.extra.get('seed', 0)}: the two must be one model")
        as_llm = dataclasses.replace(eagle.base, is_spec_decode_base=False, max_verify_tree_size=0)
        if as_llm != llm.base:
            raise ConfigError(f"{eagle_path}.base", f"is not toy-llm's model ({_field_diff(as_llm, llm.base)}); "
                                                    f"speculative decoding is checked against toy-llm's tokens")
        toys = cls(llm, eagle, root)
        for name in ("toy-eagle/base", "toy-eagle/draft"):
            path = root / name / CONFIG_FILE
            if path.is_file():
                got = LLMEngineConfig.from_json(path)
                want = toys.config(name)
                if got != want:
                    raise ConfigError(str(path), f"disagrees with {eagle_path} ({_field_diff(got, want)})")
        return toys

    # -- configs, weights, reference engines -----------------------------------------------------
    @property
    def seed(self) -> int:
        return int(self.llm.extra.get("seed", 0))

    @property
    def llm_config(self) -> LLMEngineConfig:
        return self.llm.base

    def config(self, name: str) -> LLMEngineConfig:
        """The LLMEngineConfig of ``"toy-llm"``, ``"toy-eagle/base"`` or ``"toy-eagle/draft"``."""
        if name == "toy-llm":
            return self.llm.base
        if name == "toy-eagle/base":
            return self.eagle.base
        if name == "toy-eagle/draft":
            assert self.eagle.draft is not None
            return self.eagle.draft
        raise UnknownNameError(f"unknown toy engine {name!r}; expected one of {ENGINE_NAMES}")

    def weights(self, name: str) -> ToyWeights:
        """Seeded weights; toy-llm and toy-eagle/base share one set, the draft is derived from it."""
        self.config(name)
        if name not in self._weights:
            base = self._weights.get("toy-llm") or ToyWeights.generate(self.llm.base, self.seed)
            self._weights["toy-llm"] = self._weights["toy-eagle/base"] = base
            self._weights["toy-eagle/draft"] = ToyWeights.generate_draft(self.config("toy-eagle/draft"), base,
                                                                         self.seed)
        return self._weights[name]

    def embedding(self) -> np.ndarray:
        """The token embedding table runtimes use with these engines (float32 [vocab, hidden])."""
        cfg = self.llm.base
        return toy_embedding(cfg.vocab_size, cfg.hidden_size, self.seed)

    def reference_engine(self, name: str, *, device: str = "auto", null_compute: bool = False) -> Any:
        """A :class:`~trtio.testing.ReferenceEngine` computing engine ``name`` with its seeded weights."""
        from trtio.testing.reference_engine import ReferenceEngine  # noqa: PLC0415 - heavy, loaded on use

        cfg = self.config(name)
        weights = None if null_compute else self.weights(name)
        return ReferenceEngine.from_config(cfg, weights=weights, device=device, null_compute=null_compute)

    def fingerprint(self) -> str:
        """A short hash of everything a plan bakes in (configs and seed)."""
        data = {"llm": self.llm.to_dict(), "eagle": self.eagle.to_dict()}
        for d in data.values():
            d.pop("name", None)
            d.pop("description", None)
        text = json.dumps(data, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    # -- built engine folders --------------------------------------------------------------------
    def write_configs(self, out: str | os.PathLike[str]) -> None:
        """Write the configs in the engines layout under ``out`` (the deployments and each engine's)."""
        out = Path(out)
        for name in ("toy-llm", "toy-eagle", "toy-eagle/base", "toy-eagle/draft"):
            (out / name).mkdir(parents=True, exist_ok=True)
        self.llm.to_json(out / "toy-llm" / CONFIG_FILE)
        self.eagle.to_json(out / "toy-eagle" / CONFIG_FILE)
        self.config("toy-eagle/base").to_json(out / "toy-eagle" / "base" / CONFIG_FILE)
        self.config("toy-eagle/draft").to_json(out / "toy-eagle" / "draft" / CONFIG_FILE)

    def plans_in(self, directory: str | os.PathLike[str]) -> dict[str, Path] | None:
        """The three plans under ``directory`` (engines layout), or None when any is missing.

        Raises :class:`~trtio.ConfigError` when the plans are there but were built from other configs
        or another seed (the ``config.json`` files beside them say so).
        """
        directory = Path(directory)
        plans = {name: directory / name / PLAN_FILE for name in ENGINE_NAMES}
        if not all(p.is_file() for p in plans.values()):
            return None
        try:
            built = ToyEngines.load(directory)
        except ConfigError as exc:
            raise ConfigError(str(directory), f"its plans come with configs that cannot be used: {exc}") from None
        if built.llm != self.llm or built.eagle != self.eagle or built.seed != self.seed:
            what = [f"{n}: {_field_diff(built.config(n), self.config(n))}" for n in ENGINE_NAMES
                    if built.config(n) != self.config(n)]
            if built.eagle.spec != self.eagle.spec:
                what.append(f"spec: {_field_diff(built.eagle.spec, self.eagle.spec)}")
            if built.seed != self.seed:
                what.append(f"seed {built.seed} vs {self.seed}")
            raise ConfigError(str(directory), f"its plans were built from other configs than {self.root} "
                                              f"({'; '.join(what)}); rebuild them with scripts/build_toy_engines.py")
        return plans

    def build_plans(self, out: str | os.PathLike[str], module: str | ModuleType = "auto", *,
                    progress: bool = True, stream: TextIO | None = None,
                    engines: tuple[str, ...] = ENGINE_NAMES) -> dict[str, Path]:
        """Build ``engines`` as plans under ``out`` (engines layout) with TensorRT or TensorRT-RTX and
        write the configs beside them. Returns each engine's plan path."""
        from trtio.testing.toy_build import build_plan, resolve_module  # noqa: PLC0415 - needs TensorRT

        trt = resolve_module(module)
        out = Path(out)
        paths = {}
        for name in engines:
            path = out / name / PLAN_FILE
            build_plan(trt, self.config(name), self.weights(name), path, progress=progress, label=name,
                       stream=stream)
            paths[name] = path
        self.write_configs(out)
        return paths

    def cached_plans(self, module: str | ModuleType = "auto", *, progress: bool = True,
                     stream: TextIO | None = None) -> dict[str, Path]:
        """Plans for these configs in :func:`plan_cache_dir`, built there first if missing. The folder
        is named after the TensorRT module, its version and :meth:`fingerprint`."""
        from trtio.testing.toy_build import resolve_module  # noqa: PLC0415 - needs TensorRT

        trt = resolve_module(module)
        version = getattr(trt, "__version__", "unknown")
        directory = plan_cache_dir() / "toy-engines" / f"{trt.__name__}-{version}-{self.fingerprint()}"
        try:
            found = self.plans_in(directory)
        except ConfigError:
            found = None  # a half-written or foreign cache entry: build it again
        return found or self.build_plans(directory, trt, progress=progress, stream=stream)


@dataclass(frozen=True)
class RaggedToyEngines:
    """The ragged toy engines of one engines folder (module docstring): two Edge-LLM engine directories."""

    llm_dir: EngineDir
    pair_dir: EngineDir
    root: Path
    _weights: dict[str, ToyWeights] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def load(cls, root: str | os.PathLike[str] | None = None) -> RaggedToyEngines:
        """Open ``root/toy-llm-ragged`` and ``root/toy-eagle3-ragged`` with :meth:`EngineDir.open` and check
        that the LLM and the pair's base are one model.

        Raises :class:`~trtio.ConfigError` naming the directory or file and what is wrong.
        """
        root = Path(root) if root is not None else default_engines_dir()
        dirs = []
        for name, kind in zip(RAGGED_DIRS, ("llm", "spec_decode")):
            path = root / name
            if not path.is_dir():
                raise ConfigError(str(path), f"no such engine directory (the ragged toy engines are {RAGGED_DIRS[0]}/"
                                             f" and {RAGGED_DIRS[1]}/ in Edge-LLM's layout)")
            directory = EngineDir.open(path)
            if directory.kind != kind:
                raise ConfigError(str(path), f"holds a {directory.kind} engine directory, expected a {kind} one")
            dirs.append(directory)
        llm_dir, pair_dir = dirs
        llm, base = llm_dir.config, pair_dir.base_config
        diffs = [f"{f} {getattr(base, f)!r} vs {getattr(llm, f)!r}" for f in _MODEL_FIELDS
                 if getattr(base, f) != getattr(llm, f)]
        if diffs:
            raise ConfigError(str(pair_dir.config_path("base")),
                              f"is not {RAGGED_DIRS[0]}'s model ({', '.join(diffs)}); speculative decoding is checked "
                              f"against {RAGGED_DIRS[0]}'s greedy tokens")
        return cls(llm_dir, pair_dir, root)

    @property
    def seed(self) -> int:
        return RAGGED_SEED

    @property
    def llm_config(self) -> LLMEngineConfig:
        return self.llm_dir.config

    def config(self, name: str) -> LLMEngineConfig:
        """The LLMEngineConfig of one of :data:`RAGGED_ENGINE_NAMES`."""
        if name == RAGGED_ENGINE_NAMES[0]:
            return self.llm_dir.config
        if name == RAGGED_ENGINE_NAMES[1]:
            return self.pair_dir.base_config
        if name == RAGGED_ENGINE_NAMES[2]:
            return self.pair_dir.draft_config
        raise UnknownNameError(f"unknown ragged toy engine {name!r}; expected one of {RAGGED_ENGINE_NAMES}")

    def deployment(self, draft_top_k: int = RAGGED_DEMO_TREE[0], draft_step: int = RAGGED_DEMO_TREE[1],
                   verify_size: int = RAGGED_DEMO_TREE[2]) -> DeploymentConfig:
        """The pair's :class:`~trtio.DeploymentConfig` with Edge-LLM's three run-time values (checked
        against the configs' tree caps by :meth:`EngineDir.deployment`)."""
        return self.pair_dir.deployment(draft_top_k, draft_step, verify_size)

    def weights(self, name: str) -> ToyWeights:
        """Seeded weights (seed :data:`RAGGED_SEED`); the LLM and the base share one set, the draft is
        derived from it."""
        self.config(name)
        if name not in self._weights:
            base = self._weights.get(RAGGED_ENGINE_NAMES[0]) or ToyWeights.generate(self.llm_config, self.seed)
            self._weights[RAGGED_ENGINE_NAMES[0]] = self._weights[RAGGED_ENGINE_NAMES[1]] = base
            self._weights[RAGGED_ENGINE_NAMES[2]] = ToyWeights.generate_draft(self.config(RAGGED_ENGINE_NAMES[2]),
                                                                              base, self.seed)
        return self._weights[name]

    def embedding(self) -> np.ndarray:
        """The token embedding table runtimes use with these engines (float32 [vocab, hidden])."""
        cfg = self.llm_config
        return toy_embedding(cfg.vocab_size, cfg.hidden_size, self.seed)

    def reference_engine(self, name: str, *, device: str = "auto", null_compute: bool = False) -> Any:
        """A :class:`~trtio.testing.ReferenceEngine` of the ragged contract computing engine ``name``."""
        from trtio.testing.reference_engine import ReferenceEngine  # noqa: PLC0415 - heavy, loaded on use

        cfg = self.config(name)
        weights = None if null_compute else self.weights(name)
        return ReferenceEngine.from_config(cfg, weights=weights, device=device, null_compute=null_compute,
                                           name=name)

    def write_configs(self, out: str | os.PathLike[str]) -> None:
        """Write both engine directories' configs under ``out``, as read (Edge-LLM's JSON)."""
        out = Path(out)
        for directory in (self.llm_dir, self.pair_dir):
            target = out / directory.path.name
            target.mkdir(parents=True, exist_ok=True)
            for role in directory.roles:
                text = json.dumps(directory.raw(role), indent=2) + "\n"
                (target / directory.config_path(role).name).write_text(text)


@dataclass(frozen=True)
class TensorParallelToyEngines:
    """A tensor-parallel toy directory (:data:`TP_DIRS`): toy-llm-ragged's model (``ToyWeights.generate(cfg,
    0)`` of the whole model's config) across the directory's ranks, as :class:`~trtio.testing.ReferenceEngine`
    rank engines."""

    directory: EngineDir
    _weights: dict[str, ToyWeights] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def load(cls, name_or_path: str | os.PathLike[str] = TP_DIRS[0]) -> TensorParallelToyEngines:
        """Open a tensor-parallel directory: a name of :data:`TP_DIRS` (under :func:`default_engines_dir`) or a
        path. ConfigError where it is not tensor-parallel."""
        path = Path(name_or_path)
        if str(name_or_path) in TP_DIRS:
            path = default_engines_dir() / str(name_or_path)
        directory = EngineDir.open(path)
        if not directory.is_tensor_parallel:
            raise ConfigError(str(path), "is not a tensor-parallel engine directory (config_world{N}.json)")
        return cls(directory)

    @property
    def tp_size(self) -> int:
        return self.directory.tp_size

    @property
    def weights(self) -> ToyWeights:
        """The whole model's weights (every rank cuts its share out of them)."""
        if "model" not in self._weights:
            self._weights["model"] = ToyWeights.generate(self.directory.config, RAGGED_SEED)
        return self._weights["model"]

    def embedding(self) -> np.ndarray:
        cfg = self.directory.config
        return toy_embedding(cfg.vocab_size, cfg.hidden_size, RAGGED_SEED)

    def reference_engine(self, rank: int, *, device: str = "host", all_reduce: Any = None,
                         null_compute: bool = False) -> Any:
        """Rank ``rank``'s engine. ``all_reduce`` (default: on the host device, :class:`HostAllReduce
        <trtio.testing.reference_tp.HostAllReduce>`; on the GPU it must be given, e.g. a
        :class:`~trtio.testing.reference_tp.PluginAllReduce`)."""
        from trtio.testing.reference_engine import ReferenceEngine  # noqa: PLC0415 - heavy, loaded on use
        from trtio.testing.reference_tp import HostAllReduce  # noqa: PLC0415

        if all_reduce is None and device == "host" and not null_compute:
            all_reduce = HostAllReduce()
        return ReferenceEngine.from_config(self.directory.rank_config(rank), device=device, null_compute=null_compute,
                                           weights=None if null_compute else self.weights, tp_rank=rank,
                                           tp_size=self.tp_size, all_reduce=all_reduce,
                                           name=self.directory.engine_path(rank).name)

    def loader(self, *, device: str = "host", all_reduce: Any = None, null_compute: bool = False) -> Any:
        """A stand-in for :func:`trtio.load_engine` (same arguments) that gives each rank engine file of the
        directory its :meth:`reference_engine`: patch ``trtio._setups.engine_dir.load_engine`` with it to run
        ``create_from_engine_dir`` on the directory without plans."""
        ranks = {self.directory.engine_path(r).name: r for r in range(self.tp_size)}

        def load(path: str | os.PathLike[str], module: Any = "auto", *, plugins: Any = ()) -> Any:
            name = Path(path).name
            if name not in ranks:
                raise UnknownNameError(f"{path} is not a rank engine of {self.directory.path}")
            return self.reference_engine(ranks[name], device=device, all_reduce=all_reduce, null_compute=null_compute)

        return load


class HybridToyEngine:
    """A hybrid toy directory (:data:`HYBRID_DIRS`): its config, its seeded weights (``ToyWeights.generate(cfg,
    RAGGED_SEED)``: the attention layers' and the recurrent layers' ``RecurrentWeights``), the embedding table and
    ReferenceEngines computing it."""

    def __init__(self, directory: EngineDir) -> None:
        self.directory = directory
        self.config = directory.config
        if self.config.feature(HybridConfig) is None:
            raise ConfigError(str(directory.path), "is not a hybrid engine directory (its config.json has no "
                                                   "recurrent layer in layer_types)")
        self.weights = ToyWeights.generate(self.config, RAGGED_SEED)

    @classmethod
    def load(cls, name_or_path: str | os.PathLike[str] = HYBRID_DIRS[0]) -> HybridToyEngine:
        """A directory of :data:`HYBRID_DIRS` by name (under :func:`default_engines_dir`) or by path."""
        path = Path(name_or_path)
        if not path.is_dir() and str(name_or_path) in HYBRID_DIRS:
            path = default_engines_dir() / str(name_or_path)
        return cls(EngineDir.open(path))

    @property
    def name(self) -> str:
        return self.directory.path.name

    def embedding(self) -> np.ndarray:
        """The token embedding table runtimes use with this engine (float32 [vocab, hidden])."""
        return toy_embedding(self.config.vocab_size, self.config.hidden_size, RAGGED_SEED)

    def reference_engine(self, *, device: str = "auto", null_compute: bool = False) -> Any:
        """A :class:`~trtio.testing.ReferenceEngine` computing the hybrid toy model."""
        from trtio.testing.reference_engine import ReferenceEngine  # noqa: PLC0415 - heavy, loaded on use

        return ReferenceEngine.from_config(self.config, device=device, weights=self.weights,
                                           null_compute=null_compute, name=self.name)


@dataclass(frozen=True)
class VisionToyEngines:
    """The toy vision-language model (:data:`VLM_DIR`): the LLM (``ToyWeights.generate(config, 0)``) and its
    Qwen3-VL vision encoder (``VitWeights.generate(visual_config, 0)``), as reference engines."""

    directory: EngineDir
    _weights: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def load(cls, name_or_path: str | os.PathLike[str] = VLM_DIR) -> VisionToyEngines:
        """Open the toy directory (its name under :func:`default_engines_dir`, or a path); ConfigError where the
        directory has no vision encoder."""
        path = default_engines_dir() / VLM_DIR if str(name_or_path) == VLM_DIR else Path(name_or_path)
        directory = EngineDir.open(path)
        if directory.visual_config is None or directory.kind != "llm":
            raise ConfigError(str(path), "is not a vision-language model's directory (a plain LLM with visual/)")
        return cls(directory)

    @property
    def config(self) -> LLMEngineConfig:
        return self.directory.config

    @property
    def visual_config(self) -> Any:
        """The ViT's :class:`~trtio.components.visual.visual_config.VisualConfig`."""
        return self.directory.visual_config

    @property
    def weights(self) -> ToyWeights:
        if "llm" not in self._weights:
            self._weights["llm"] = ToyWeights.generate(self.config, RAGGED_SEED)
        found: ToyWeights = self._weights["llm"]
        return found

    @property
    def vit_weights(self) -> Any:
        """The ViT's :class:`~trtio.testing.reference_visual.VitWeights`."""
        from trtio.testing.reference_visual import VitWeights  # noqa: PLC0415 - heavy, loaded on use

        if "visual" not in self._weights:
            self._weights["visual"] = VitWeights.generate(self.visual_config, RAGGED_SEED)
        return self._weights["visual"]

    def embedding(self) -> np.ndarray:
        """The token embedding table (float32 [vocab, hidden])."""
        cfg = self.config
        return toy_embedding(cfg.vocab_size, cfg.hidden_size, RAGGED_SEED)

    def reference_engine(self, *, device: str = "auto", null_compute: bool = False) -> Any:
        """The LLM's :class:`~trtio.testing.ReferenceEngine`."""
        from trtio.testing.reference_engine import ReferenceEngine  # noqa: PLC0415 - heavy, loaded on use

        return ReferenceEngine.from_config(self.config, weights=None if null_compute else self.weights, device=device,
                                           null_compute=null_compute, name=VLM_DIR)

    def visual_engine(self, *, device: str = "auto", null_compute: bool = False) -> Any:
        """The ViT's :class:`~trtio.testing.reference_visual.ReferenceVisualEngine`."""
        from trtio.testing.reference_visual import ReferenceVisualEngine  # noqa: PLC0415 - heavy, loaded on use

        return ReferenceVisualEngine.from_config(self.visual_config, weights=self.vit_weights, device=device,
                                                 null_compute=null_compute, name=f"{VLM_DIR}/visual")

    def loader(self, *, device: str = "auto") -> Any:
        """A stand-in for :func:`trtio.load_engine` (same arguments) giving the directory's ``llm.engine`` and
        ``visual/visual.engine`` their reference engines: patch ``trtio._setups.engine_dir.load_engine`` with it to
        run ``create_from_engine_dir`` on the directory without plans."""
        llm, visual = self.directory.engine_path("llm"), self.directory.engine_path("visual")

        def load(path: str | os.PathLike[str], module: Any = "auto", *, plugins: Any = ()) -> Any:
            if Path(path) == llm:
                return self.reference_engine(device=device)
            if Path(path) == visual:
                return self.visual_engine(device=device)
            raise UnknownNameError(f"{path} is not an engine of {self.directory.path}")

        return load
