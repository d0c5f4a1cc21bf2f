"""LoRA adapters on Edge-LLM 0.11 engines: the engine's adapter inputs, an adapter, and its device copy.

An engine built with ``--max-lora-rank`` (its config's ``builder_config.max_lora_rank``, trtio's
``LLMEngineConfig.max_lora_rank``) takes, for every linear layer except the embeddings and the LM head, two
FP16 inputs: ``{module}.lora_A.weight`` ``[in, r]`` and ``{module}.lora_B.weight`` ``[r, out]``, where the rank
``r`` is dynamic from 0 (no adapter: empty tensors) to the max rank, and the layer computes
``x @ W + (x @ A) @ B``. One adapter serves the whole batch.

* :class:`LoraInputs` reads those inputs from an engine's declared I/O and its config (every problem in one
  :class:`~trtio.BindingError`). Inputs named after graph nodes (Edge-LLM 0.11's ``insert-lora`` on an export whose
  weights are anonymous: ``ode_linear_N.lora_A.weight``) are bound without an adapter (rank 0), so the base model in
  such an engine runs; no adapter can be matched to them, and setting one is refused saying why.
* :class:`LoraAdapter` is one adapter on the host (:meth:`LoraAdapter.load` reads Edge-LLM's ``process-lora``
  output); :meth:`LoraInputs.problems` says where it does not fit an engine, naming each module.
* :class:`LoraSlots` is what a setup binds: each adapter's copy in device memory trtio owns, uploaded the first
  time it is set (one tensor per LoRA input at the adapter's ranks; a module it leaves out, and no adapter: an empty
  tensor). Setting an adapter rebinds the engine's LoRA inputs to its own copy (a variant of the tensor map,
  :meth:`~trtio._tensor_map.TensorMap.use_variant`): no device copy, no allocation, no host synchronisation (a
  copy's tensors keep their views for good, :func:`~trtio._tensor.fix_view`, so no view is set either). CUDA
  graphs are therefore kept per adapter, as Edge-LLM keeps them: the executor keys them by the bound addresses, and
  takes back the plans and graphs of an adapter set again. The copies are bounded (the last
  :data:`~trtio._cache.CACHE_LIMIT` adapters, in one :class:`~trtio._cache.BoundedCache`); an evicted one (never the
  set one) is let go by the executor with its plans and graphs first (:meth:`~trtio._engine.EngineExecutor.forget`),
  then freed, and uploaded and captured again if it is set again. The worst case of one copy (every module at the
  max rank) is :meth:`LoraInputs.worst_case_report`, which ``trtio plan`` shows.

What this module assumes where Edge-LLM leaves the contract open is listed, with how to check it, in
``docs/edgellm-assumptions.md`` ("LoRA").
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from trtio._cache import CACHE_LIMIT, BoundedCache
from trtio._cuda.backend import Backend, Location
from trtio._dtypes import DType
from trtio._engine import EngineExecutor, EngineIO, TensorInfo
from trtio._json import read_json
from trtio._lifetime import Closeable
from trtio._memory import Arena, MemoryReport, TensorRequest, planned_report
from trtio._stream import Stream
from trtio._tensor import Tensor, fix_view
from trtio._tensor_map import TensorMap
from trtio.errors import BindingError, ConfigError, InvalidTypeError, InvalidValueError, TrtioError

__all__ = ["LORA_A", "LORA_B", "LoraAdapter", "LoraInputs", "LoraModule", "LoraSlots", "lora_input_names"]

#: The suffixes of a module's two LoRA inputs (and of its two tensors in an adapter file).
LORA_A = ".lora_A.weight"
LORA_B = ".lora_B.weight"
# The prefix PEFT writes before every module name; an adapter file may keep it.
_PEFT_PREFIX = "base_model.model."
# A LoRA input named after an ONNX graph node rather than a model module: Edge-LLM 0.11's insert-lora drops the
# first character of a node's name, so torch's dynamo exporter's ``node_linear_N`` gives ``ode_linear_N``. A module
# path has dots, a node name none.
_NODE_NAME = re.compile(r"n?ode_\w+|[A-Za-z_]*linear(_\d+)?")
# The fused q/k/v linear of Edge-LLM's ONNX export (``models/default/modeling_default.py``), and what it fuses.
_FUSED_QKV = ("qkv_proj_fused", "qkv_proj")
_QKV = ("q_proj", "k_proj", "v_proj")
_DTYPE = DType.FLOAT16


def lora_input_names(names: list[str]) -> list[str]:
    """The LoRA inputs among ``names`` (engine I/O names), in their order."""
    return [n for n in names if n.endswith(LORA_A) or n.endswith(LORA_B)]


@dataclass(frozen=True)
class LoraModule:
    """One linear layer an adapter may change: its module name and its ``in`` / ``out`` widths."""

    name: str
    in_features: int
    out_features: int

    @property
    def a_name(self) -> str:
        return self.name + LORA_A

    @property
    def b_name(self) -> str:
        return self.name + LORA_B

    def nbytes(self, rank: int) -> int:
        """Bytes of its two inputs at ``rank`` (FP16)."""
        return _DTYPE.nbytes((self.in_features + self.out_features) * rank)


@dataclass(frozen=True, eq=False)  # compared by identity: a setup keeps each adapter's device copy by it
class LoraAdapter:
    """One LoRA adapter on the host: per module, ``A`` ``[in, r]`` and ``B`` ``[r, out]`` (numpy float16; the
    scaling ``alpha / r`` already folded into ``B``, as Edge-LLM's ``process-lora`` writes it).

    Made with :meth:`load` or :meth:`from_arrays`, which check that each module's pair is two matrices of one
    rank (naming the module); whether it fits an engine is :meth:`LoraInputs.problems`. The arrays are read-only
    copies, so an adapter never changes once made."""

    name: str
    weights: Mapping[str, tuple[np.ndarray, np.ndarray]]

    @classmethod
    def from_arrays(cls, weights: Mapping[str, Any], *, name: str = "adapter") -> LoraAdapter:
        """An adapter of ``weights`` (module name -> ``(A, B)``, anything numpy takes). Dtypes are kept as
        given (an engine takes FP16: :meth:`LoraInputs.problems` refuses another, rather than rounding)."""
        if not isinstance(weights, Mapping):
            raise InvalidTypeError(f"LoraAdapter {name!r}: weights must map module names to (A, B) pairs, got "
                                   f"{type(weights).__name__}")
        out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        problems = []
        for module, pair in weights.items():
            if not isinstance(module, str) or not isinstance(pair, (tuple, list)) or len(pair) != 2:
                problems.append(f"{module!r}: expected a module name -> (A, B) pair, got {type(pair).__name__}")
                continue
            a, b = (np.array(x, copy=True) for x in pair)
            if a.ndim != 2 or b.ndim != 2:
                problems.append(f"{module}: A {list(a.shape)} and B {list(b.shape)} must be matrices ([in, r] "
                                f"and [r, out])")
            elif a.shape[1] != b.shape[0]:
                peft = " (PEFT's layout, A [r, in] and B [out, r]: run Edge-LLM's process-lora on the adapter)" \
                    if a.shape[0] == b.shape[1] else ""
                problems.append(f"{module}: A is {list(a.shape)} ([in, r]) but B is {list(b.shape)} ([r, out]): "
                                f"the ranks {a.shape[1]} and {b.shape[0]} differ{peft}")
            else:
                a.flags.writeable = b.flags.writeable = False
                out[module] = (a, b)
        if problems:
            raise InvalidValueError(f"LoraAdapter {name!r}: " + "; ".join(problems))
        return cls(name, MappingProxyType(out))

    @classmethod
    def load(cls, path: str | os.PathLike[str], *, name: str | None = None) -> LoraAdapter:
        """The adapter Edge-LLM's ``tensorrt-edgellm-process-lora`` wrote at ``path``: a ``.safetensors`` file,
        or a directory holding ``adapter_model.safetensors`` (or exactly one ``.safetensors`` file), read with the
        ``safetensors`` package. Its tensors are ``{module}.lora_A.weight`` ``[in, r]`` and
        ``{module}.lora_B.weight`` ``[r, out]`` (a leading ``base_model.model.`` is dropped); a file safetensors
        cannot read, any other tensor, an A without its B or a dtype other than F16 (or F32) is a
        :class:`~trtio.ConfigError` naming the file and the key. ``name`` defaults to the directory's name (for a
        directory: ``process-lora``'s output folder), else the file's stem (its folder's name for
        ``adapter_model.safetensors``).

        The adapter's PEFT config beside the file (``config.json``, where ``process-lora`` copies the adapter's
        ``adapter_config.json``, or ``adapter_config.json`` itself) is read where there is one: ``process-lora`` folds
        one ``lora_alpha / r`` into every module's B, so an adapter trained with ``use_rslora`` (``lora_alpha /
        sqrt(r)``) or whose ``rank_pattern`` / ``alpha_pattern`` give a module another rank or alpha is refused, a
        :class:`~trtio.ConfigError` naming the config file, the key and its value. A ``config.json`` that is not an
        adapter's (no ``peft_type``, ``r`` or ``lora_alpha``) is not read."""
        given = Path(os.fspath(path))
        file = _adapter_file(given)
        _check_adapter_config(file.parent)
        pairs: dict[str, list[tuple[str, np.ndarray] | None]] = {}
        for key, tag, array in _read_adapter_file(file):
            module = key[len(_PEFT_PREFIX):] if key.startswith(_PEFT_PREFIX) else key
            if module.endswith(LORA_A):
                pairs.setdefault(module[:-len(LORA_A)], [None, None])[0] = (tag, array)
            elif module.endswith(LORA_B):
                pairs.setdefault(module[:-len(LORA_B)], [None, None])[1] = (tag, array)
            else:
                raise ConfigError(f"{file}: {key}", f"is not a LoRA weight ({{module}}{LORA_A} or "
                                                    f"{{module}}{LORA_B}, as process-lora writes them)")
        weights = {}
        for module, (a, b) in pairs.items():
            if a is None or b is None:
                missing = LORA_A if a is None else LORA_B
                raise ConfigError(f"{file}: {module}{missing}", "is missing: a module's adapter is an A and a B")
            if a[0] != b[0]:
                raise ConfigError(f"{file}: {module}", f"A is {a[0]} and B {b[0]}: an adapter for an Edge-LLM engine "
                                                       "is F16 (process-lora writes F16)")
            weights[module] = (a[1], b[1])
        if given.is_dir():
            default = given.resolve().name
        elif file.name == "adapter_model.safetensors":
            default = file.resolve().parent.name
        else:
            default = file.stem
        return cls.from_arrays(weights, name=name if name is not None else default)

    @property
    def modules(self) -> tuple[str, ...]:
        return tuple(self.weights)

    @property
    def ranks(self) -> dict[str, int]:
        """Each module's rank."""
        return {m: int(a.shape[1]) for m, (a, _b) in self.weights.items()}

    def __repr__(self) -> str:
        ranks = sorted(set(self.ranks.values()))
        return f"LoraAdapter({self.name!r}, {len(self.weights)} modules, rank {ranks[0] if len(ranks) == 1 else ranks})"


#: Where an adapter's PEFT config lies beside its weights: ``process-lora``'s copy, then PEFT's own name.
_ADAPTER_CONFIGS = ("config.json", "adapter_config.json")


def _check_adapter_config(folder: Path) -> None:
    """Refuse an adapter whose PEFT config (beside its weights, :data:`_ADAPTER_CONFIGS`) scales a module other than
    by ``lora_alpha / r``, the one scaling ``process-lora`` folds into B (Edge-LLM 0.11's
    ``tensorrt_edgellm/lora/lora.py``: ``_load_adapter_config`` reads only ``lora_alpha`` and ``r``)."""
    for name in _ADAPTER_CONFIGS:
        path = folder / name
        if not path.is_file():
            continue
        raw = read_json(path)
        if not isinstance(raw, Mapping) or not {"peft_type", "r", "lora_alpha"} & set(raw):
            continue  # not an adapter's config (an engine's config.json, say)
        r, alpha = raw.get("r"), raw.get("lora_alpha")
        why = (f"Edge-LLM's process-lora scales every module's B by lora_alpha / r ({alpha} / {r}), so the engine "
               f"would compute another model than the adapter's (merge the adapter into the checkpoint instead: "
               f"tensorrt-edgellm-merge-lora)")
        rslora = raw.get("use_rslora", False)
        if rslora not in (False, None):
            raise ConfigError(f"{path}: use_rslora", f"is {rslora!r}, expected false: the adapter was trained with "
                                                     f"rank-stabilized scaling (lora_alpha / sqrt(r)), but {why}")
        for key, default in (("rank_pattern", r), ("alpha_pattern", alpha)):
            pattern = raw.get(key) or {}
            if not isinstance(pattern, Mapping):
                raise ConfigError(f"{path}: {key}", f"expected a mapping of module patterns, got {pattern!r}")
            other = {k: v for k, v in pattern.items() if v != default}
            if other:
                module, value = next(iter(other.items()))
                what = "rank" if key == "rank_pattern" else "lora_alpha"
                raise ConfigError(f"{path}: {key}", f"is {dict(pattern)!r}, expected no module of another {what}: "
                                                    f"it gives {module!r} {what} {value}, not the adapter's "
                                                    f"{default}, but {why}")
        return


def _adapter_file(path: Path) -> Path:
    if path.is_dir():
        preferred = path / "adapter_model.safetensors"
        if preferred.is_file():
            return preferred
        found = sorted(path.glob("*.safetensors"))
        if len(found) != 1:
            raise ConfigError(str(path), f"holds {len(found)} .safetensors files; a LoRA adapter directory holds "
                                         "adapter_model.safetensors (or exactly one .safetensors file)")
        return found[0]
    if not path.is_file():
        raise ConfigError(str(path), "does not exist: expected a LoRA adapter (.safetensors file or its directory)")
    return path


def _read_adapter_file(file: Path) -> list[tuple[str, str, np.ndarray]]:
    """Every tensor of the adapter ``file``: (key, safetensors dtype tag, array), read with the ``safetensors``
    package (a trtio dependency); a tensor of a dtype other than F16 or F32 is refused before it is read."""
    try:
        from safetensors import SafetensorError, safe_open  # noqa: PLC0415 - read where an adapter is loaded
    except ImportError as exc:
        raise ConfigError(str(file), f"LoraAdapter.load reads adapters with the safetensors package, which is "
                                     f"not installed ({exc}); it is a dependency of trtio: pip install "
                                     "safetensors") from None
    out = []
    try:
        with safe_open(str(file), framework="numpy") as f:
            for key in f.keys():
                tag = f.get_slice(key).get_dtype()
                if tag not in ("F16", "F32"):
                    raise ConfigError(f"{file}: {key}", f"is {tag}: an adapter for an Edge-LLM engine is F16 "
                                                        "(process-lora writes F16)")
                out.append((key, tag, f.get_tensor(key)))
    except SafetensorError as exc:
        raise ConfigError(str(file), f"is not a safetensors file safetensors can read: {exc}") from None
    except OSError as exc:
        raise ConfigError(str(file), f"cannot be read ({type(exc).__name__}: {exc.strerror or exc})") from None
    return out


@dataclass(frozen=True)
class LoraInputs:
    """An engine's LoRA inputs: its modules (in the engine's order), the max rank (the config's), and the modules
    named after ONNX graph nodes (``node_named``: bound at rank 0 for good, no adapter can be matched to them)."""

    engine: str
    modules: tuple[LoraModule, ...]
    max_rank: int
    node_named: tuple[str, ...] = ()

    @classmethod
    def from_engine(cls, eio: EngineIO, max_rank: int) -> LoraInputs | None:
        """The LoRA inputs ``eio`` declares, checked against ``max_rank`` (the config's ``max_lora_rank``);
        None for an engine without them and a config of max rank 0. Every disagreement is listed in one
        :class:`~trtio.BindingError`: an A without its B, a dtype other than FP16, fixed dims that are not
        ``[in, r]`` / ``[r, out]``, a rank range that does not start at 0 (no adapter) or stops below ``max_rank``,
        inputs with max rank 0 or max rank without inputs. Inputs named after graph nodes are checked the same way
        and kept (bound at rank 0: the base model runs); :meth:`check` refuses an adapter for them, saying why."""
        found = [info for info in eio.tensors if info.is_input and (info.name.endswith(LORA_A)
                                                                    or info.name.endswith(LORA_B))]
        if not found and not max_rank:
            return None
        problems = []
        if not found:
            problems.append(f"max_lora_rank is {max_rank} but the engine declares no LoRA input "
                            f"({{module}}{LORA_A} / {{module}}{LORA_B}); was it built with --max-lora-rank?")
        elif not max_rank:
            problems.append(f"{found[0].name}: the engine declares {len(found)} LoRA inputs but the config's "
                            "max_lora_rank is 0 (builder_config.max_lora_rank)")
        by_name = {info.name: info for info in found}
        modules = []
        for info in found:
            module = _module_of(info.name)
            if not info.name.endswith(LORA_A):
                if module + LORA_A not in by_name:
                    problems.append(f"{info.name}: the engine declares no {module}{LORA_A} beside it")
                continue
            b = by_name.get(module + LORA_B)
            if b is None:
                problems.append(f"{info.name}: the engine declares no {module}{LORA_B} beside it")
                continue
            problems += _input_problems(info, 1, max_rank) + _input_problems(b, 0, max_rank)
            if info.shape[0] > 0 and b.shape[1] > 0:
                modules.append(LoraModule(module, info.shape[0], b.shape[1]))
        if problems:
            raise BindingError(eio.name, problems)
        nodes = tuple(m.name for m in modules if _is_node_name(m.name))
        return cls(eio.name, tuple(modules), max_rank, nodes)

    @property
    def names(self) -> list[str]:
        """Every LoRA input name (A then B, module by module)."""
        return [n for m in self.modules for n in (m.a_name, m.b_name)]

    @property
    def takes_adapters(self) -> bool:
        """Whether an adapter can be matched to any module (False: every input is named after a graph node)."""
        return not self.node_named or len(self.node_named) < len(self.modules)

    def _ranks(self, ranks: Mapping[str, int] | None) -> dict[str, int]:
        nodes = set(self.node_named)
        return {m.name: 0 if m.name in nodes else self.max_rank if ranks is None else ranks.get(m.name, 0)
                for m in self.modules}

    def worst_case_bytes(self) -> int:
        """Bytes of every LoRA input at the max rank (the most one adapter's device copy holds; an input named after
        a graph node stays at rank 0)."""
        ranks = self._ranks(None)
        return sum(m.nbytes(ranks[m.name]) for m in self.modules)

    def requests(self, ranks: Mapping[str, int] | None = None) -> list[TensorRequest]:
        """One device tensor per LoRA input, at each module's rank in ``ranks`` (a module left out, and one named
        after a graph node: 0, an empty tensor); None: every module at the max rank (the worst case)."""
        at = self._ranks(ranks)
        return [req for m in self.modules
                for req in (TensorRequest(m.a_name, (m.in_features, at[m.name]), _DTYPE, Location.DEVICE),
                            TensorRequest(m.b_name, (at[m.name], m.out_features), _DTYPE, Location.DEVICE))]

    def node_named_reason(self) -> str:
        """Why no adapter can be matched to the modules named after graph nodes (empty if there are none)."""
        if not self.node_named:
            return ""
        shown = ", ".join(self.node_named[:3])
        return (f"{len(self.node_named)} of its {len(self.modules)} LoRA modules are named after ONNX graph nodes "
                f"({shown}{', ...' if len(self.node_named) > 3 else ''}), not model modules "
                "(model.layers.<i>.mlp.down_proj, ...), so no adapter's weights can be matched to them; they stay "
                "at rank 0 (no adapter). Edge-LLM 0.11's insert-lora names a MatMul's LoRA inputs after its node, "
                "and torch's dynamo exporter names them node_linear_N: rename each weight MatMul /<module>/MatMul "
                "before insert-lora, or build with Edge-LLM's checkpoint builder (--max-lora-rank), so the inputs "
                "carry module names")

    def worst_case_report(self) -> MemoryReport:
        """What one adapter's device copy takes at most (every module at the max rank), laid out as its arena would
        be, allocating nothing: ``trtio plan``'s LoRA part."""
        report = planned_report(self.requests(), "lora")
        if not self.takes_adapters:
            report.notes.append(f"LoRA: {len(self.modules)} modules named after ONNX graph nodes: bound at rank 0 "
                                f"(no adapter), no adapter can be set ({self.node_named_reason()})")
            return report
        report.notes.append(f"LoRA: {len(self.modules)} modules at max_lora_rank {self.max_rank}: one adapter's "
                            f"device copy holds at most {self.worst_case_bytes()} bytes (every module at the max "
                            f"rank; the lora entries), made when set_lora first sets it; the setup keeps up to "
                            f"{CACHE_LIMIT} adapters' copies")
        return report

    def problems(self, adapter: LoraAdapter) -> list[str]:
        """Where ``adapter`` does not fit these inputs, one line per module: a module the engine has no LoRA
        input for, a rank above the max, a dtype other than FP16, an ``in`` or ``out`` width of another
        module's."""
        known = {m.name: m for m in self.modules if m.name not in set(self.node_named)}
        problems = []
        for module, (a, b) in adapter.weights.items():
            m = known.get(module)
            if m is None:
                problems.append(self._unknown(module, known))
                continue
            rank = int(a.shape[1])
            if rank > self.max_rank:
                problems.append(f"{module}: rank {rank} is above the engine's max_lora_rank {self.max_rank}")
            for what, arr in (("A", a), ("B", b)):
                if arr.dtype != np.float16:
                    problems.append(f"{module}: {what} is {arr.dtype}, the engine's {what} input is float16 "
                                    "(convert the adapter: process-lora writes FP16)")
            if a.shape[0] != m.in_features or b.shape[1] != m.out_features:
                problems.append(f"{module}: A {list(a.shape)} and B {list(b.shape)}, the engine takes "
                                f"[{m.in_features}, r] and [r, {m.out_features}]")
        return problems

    def _unknown(self, module: str, known: Mapping[str, LoraModule]) -> str:
        """Why ``module`` of an adapter has no input here: a node-named input, q/k/v the export fused, or none."""
        if module in set(self.node_named):
            return f"{module}: the engine {self.engine!r} names this LoRA input after an ONNX graph node, which no " \
                   "adapter module can be matched to"
        parent, _, leaf = module.rpartition(".")
        fused = next((f"{parent}.{name}" for name in _FUSED_QKV if f"{parent}.{name}" in known), None)
        if leaf in _QKV and fused is not None:
            return (f"{module}: the engine {self.engine!r} has no LoRA input for this module: it fuses q/k/v into "
                    f"{fused} (Edge-LLM's ONNX export); fold the adapter's {', '.join(_QKV)} into that module "
                    "(A [in, 3r] side by side, B [3r, q+k+v] block-diagonal)")
        return (f"{module}: the engine {self.engine!r} has no LoRA input for this module (it has {len(known)}, e.g. "
                f"{next(iter(known), 'none')})")

    def check(self, adapter: Any, what: str) -> LoraAdapter:
        """``adapter`` if it fits (see :meth:`problems`), else an InvalidValueError naming every module; a
        :class:`~trtio.ConfigError` saying why on an engine whose LoRA inputs are all named after graph nodes
        (:attr:`node_named`), which takes no adapter."""
        if not isinstance(adapter, LoraAdapter):
            raise InvalidTypeError(f"{what}: expected a trtio.LoraAdapter or None, got {type(adapter).__name__}")
        if not self.takes_adapters:
            raise ConfigError(self.modules[0].a_name, f"{what}: engine {self.engine!r} takes no LoRA adapter: "
                                                      f"{self.node_named_reason()}. It runs without an adapter "
                                                      "(set_lora(None))")
        problems = self.problems(adapter)
        if problems:
            raise InvalidValueError(f"{what}: adapter {adapter.name!r} does not fit engine {self.engine!r}: "
                                    + "; ".join(problems))
        return adapter


def _is_node_name(module: str) -> bool:
    return "." not in module and _NODE_NAME.fullmatch(module) is not None


def _module_of(name: str) -> str:
    return name[:-len(LORA_A)] if name.endswith(LORA_A) else name[:-len(LORA_B)]


def _input_problems(info: TensorInfo, rank_dim: int, max_rank: int) -> list[str]:
    """An A (``rank_dim`` 1) or B (0) input that is not FP16 ``[fixed, r]`` / ``[r, fixed]`` with r in 0..max."""
    problems = []
    if info.dtype is not _DTYPE:
        problems.append(f"{info.name}: the engine declares {info.dtype}; LoRA inputs are float16")
    want = "[in, r]" if rank_dim == 1 else "[r, out]"
    if len(info.shape) != 2 or info.shape[1 - rank_dim] <= 0 or info.shape[rank_dim] >= 0:
        problems.append(f"{info.name}: shape {list(info.shape)}, a LoRA input is {want} with a dynamic rank")
        return problems
    for p, (lo, _opt, hi) in enumerate(info.profiles):
        if lo[rank_dim] != 0 or hi[rank_dim] < max_rank:
            problems.append(f"{info.name}: profile {p} takes ranks {lo[rank_dim]} .. {hi[rank_dim]}, the config "
                            f"needs 0 (no adapter) .. {max_rank} (max_lora_rank)")
    return problems


class _DeviceAdapter(Closeable):
    """One adapter's copy in device memory trtio owns: one tensor per LoRA input at the adapter's ranks (a module
    it leaves out, and every module of the no-adapter copy, ``adapter`` None: an empty tensor, no memory), which the
    engine binds while the adapter is set. Hashable by identity: the tensor map's variant (its binding set)."""

    def __init__(self, adapter: LoraAdapter | None, inputs: LoraInputs, backend: Backend,
                 stream: Stream | None = None) -> None:
        self._init_lifetime(f"LoRA adapter {adapter.name!r}" if adapter is not None else "no LoRA adapter")
        self.adapter = adapter  # keeps the host arrays alive until their uploads have run
        ranks = adapter.ranks if adapter is not None else {}
        self.arena = Arena(inputs.requests(ranks), backend=backend,
                           title=f"lora {adapter.name}" if adapter is not None else "lora none")
        try:
            for m in inputs.modules:
                pair = adapter.weights.get(m.name) if adapter is not None else None
                if pair is not None and pair[0].size + pair[1].size:
                    assert stream is not None
                    self.arena[m.a_name].copy_from(pair[0], stream)
                    self.arena[m.b_name].copy_from(pair[1], stream)
        except BaseException:
            self.arena.close()
            raise
        self.tensors: dict[str, Tensor] = {n: self.arena[n] for n in inputs.names}
        for t in self.tensors.values():
            fix_view(t)  # bound at its own shape for good: the executor sets no view of it between steps

    def __repr__(self) -> str:
        return f"_DeviceAdapter({self.adapter!r})"

    def _close_owned(self) -> None:
        self.arena.close()


class LoraSlots(Closeable):
    """A setup's LoRA inputs (see the module docstring): :attr:`tensors`, what the engine is bound to first (every
    input empty: no adapter), and the device copies of the adapters set so far (the last
    :data:`~trtio._cache.CACHE_LIMIT`; an older one is let go by the executor, with its graphs, then freed, and
    uploaded again if it is set again). :meth:`attach` it to the tensor map and executor once they are bound."""

    def __init__(self, inputs: LoraInputs, backend: Backend) -> None:
        self._init_lifetime(f"LoRA inputs of {inputs.engine!r}")
        self.inputs = inputs
        self._backend = backend
        self._none = _DeviceAdapter(None, inputs, backend)  # rank 0 everywhere: allocates nothing
        self.tensors: dict[str, Tensor] = dict(self._none.tensors)
        self._uploads: BoundedCache[int, _DeviceAdapter] = BoundedCache()
        self._bound = self._none
        self.adapter: LoraAdapter | None = None
        self._map: TensorMap | None = None
        self._executor: EngineExecutor | None = None

    def attach(self, tensor_map: TensorMap, executor: EngineExecutor) -> None:
        """The tensor map holding :attr:`tensors` and the executor that binds it: from now on :meth:`use` rebinds
        the map's LoRA inputs to the set adapter's copy, and an evicted copy is let go by ``executor`` first."""
        self._map, self._executor = tensor_map, executor
        tensor_map.use_variant(self._none.tensors, self._none)

    def knows(self, adapter: LoraAdapter) -> bool:
        """Whether ``adapter`` has its device copy here (it was checked and set before)."""
        return id(adapter) in self._uploads

    def upload(self, adapter: LoraAdapter, stream: Stream) -> _DeviceAdapter:
        """``adapter``'s device copy: made (allocated and uploaded on ``stream``) the first time, then kept (the
        cache holds the adapter, so its id names it alone). With :data:`~trtio._cache.CACHE_LIMIT` copies kept, the
        oldest but the bound adapter's is evicted first (:meth:`_evict`)."""
        self._check_open()
        found = self._uploads.get(id(adapter))
        if found is not None:
            return found
        if len(self._uploads) >= CACHE_LIMIT:
            self._evict(next(k for k, u in self._uploads.items() if u is not self._bound), stream)
        return self._uploads.put(id(adapter), _DeviceAdapter(adapter, self.inputs, self._backend, stream))

    def _evict(self, key: int, stream: Stream) -> None:
        """Free the copy kept under ``key`` (not the bound one): once ``stream`` (ordered after every earlier call
        of the setup) has run the steps that read it, the executor drops the plans and graphs that bind it and the
        tensor map forgets its binding set; then its memory goes back."""
        copy = self._uploads[key]
        assert copy is not self._bound and self._executor is not None and self._map is not None  # use() checked
        stream.synchronize()
        del self._uploads[key]
        self._executor.forget(list(copy.tensors.values()))
        self._map.forget_variant(copy)
        copy.close()

    def use(self, adapter: LoraAdapter | None, stream: Stream) -> None:
        """Bind ``adapter`` (checked; None: no adapter) for the steps after this call: the engine's LoRA inputs
        rebound to its own device copy (uploaded on ``stream`` the first time): no copy, no allocation, no host
        synchronisation once it is kept. The executor's plans and CUDA graphs are its own (its addresses)."""
        self._check_open()
        if self._map is None:
            raise TrtioError(f"{self._what}: use() before attach() (the tensor map the adapters are bound in)")
        copy = self._none if adapter is None else self.upload(adapter, stream)
        if copy is not self._bound:
            self._map.use_variant(copy.tensors, copy)
            self._bound = copy
        self.adapter = adapter

    @property
    def resident(self) -> int:
        """Adapters whose device copies are kept."""
        return len(self._uploads)

    def report(self) -> MemoryReport:
        """Every adapter's device copy kept (the no-adapter binding takes no memory)."""
        report = MemoryReport.combine("lora", [u.arena.report() for u in self._uploads.values()])
        report.notes.append(f"LoRA: {len(self.inputs.modules)} modules at max_lora_rank {self.inputs.max_rank}: each "
                            f"adapter set keeps a device copy at its ranks (at most {self.inputs.worst_case_bytes()} "
                            f"bytes), which the engine binds while it is set ({len(self._uploads)} kept now)")
        return report

    def __iter__(self) -> Iterator[tuple[str, Tensor]]:
        return iter(self.tensors.items())

    def _close_owned(self) -> None:
        with contextlib.ExitStack() as release:
            release.callback(self._none.close)
            for u in self._uploads.values():
                release.callback(u.close)
            self._uploads.clear()
