"""Dry runs: trtio's factories on a backend that hands out addresses but no memory.

``trtio plan`` and ``trtio inspect`` need what ``create_for_llm`` / ``create_for_spec_decode``
would allocate and bind for a config — exactly, through the same code — without a GPU and without
the memory (an 8B config's KV caches do not fit a laptop). :class:`DryRunBackend` is the host
backend with its device memory and device work replaced: a device ``alloc`` returns a fresh 256-byte
aligned address that points nowhere, copies, fills and enqueued work do nothing (host and pinned
buffers, the small staging twins the host writes, are real). :func:`dry_run_setup` builds the setup for a
config on it, with null-compute :class:`~trtio.testing.ReferenceEngine` s that declare the I/O contract
of ``docs/toy-model.md`` for that config (the batch-major toy contract, or Edge-LLM 0.11's ragged one
with paged KV pools where ``cfg.contract == "ragged"``, as every config read from an Edge-LLM engine
directory says). Nothing on a dry-run setup may be executed or read: its tensors have addresses,
shapes, dtypes and byte counts, and no bytes. :func:`planned_memory` is its memory report and
:func:`kv_state_rows` the KV state of each engine (contiguous caches or paged pools and their page
table).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from trtio import names
from trtio._config import DeploymentConfig, LLMEngineConfig, SpecDecodeConfig
from trtio._cuda.backend import Location
from trtio._cuda.host import HostBackend
from trtio._memory import MemoryReport, align_up
from trtio._setups import LLMSetup, SpecDecodeSetup, create_for_llm, create_for_spec_decode
from trtio._setups.binding import BoundEngine
from trtio._tools.sequence_fit import round_width
from trtio.errors import ConfigError, InvalidValueError
from trtio.families.gemma4.gemma4_config import Gemma4Config
from trtio.families.hybrid.hybrid_config import HybridConfig, is_recurrent_state
from trtio.families.lora.adapters import LoraInputs
from trtio.families.lora.lora_config import LoraConfig

__all__ = ["DryRunBackend", "dry_run_setup", "companion_deployment", "kv_state_rows", "planned", "planned_memory"]

_DEFAULT_NAMES = {"llm": "toy-llm", "base": "toy-base", "draft": "toy-draft"}

_FAKE_BASE = 1 << 44  # far from any real host or device address, so a stray read faults loudly


class DryRunBackend(HostBackend):
    """The host backend without memory: addresses are counted, never backed (see module docstring)."""

    name = "dry-run"

    def __init__(self) -> None:
        super().__init__()
        self._next = _FAKE_BASE
        self.allocated: dict[Location, int] = {}

    def alloc(self, nbytes: int, location: Location) -> int:
        if nbytes <= 0:
            raise InvalidValueError(f"alloc of {nbytes} bytes: size must be positive")
        if location is not Location.DEVICE:
            # Host-side buffers are real (small: staging twins), so the host may fill them as in any step.
            ptr = super().alloc(nbytes, location)
            with self._lock:
                self.allocated[location] = self.allocated.get(location, 0) + int(nbytes)
            return ptr
        with self._lock:
            self.alloc_count += 1
            ptr = self._next
            self._next += align_up(int(nbytes)) + 256
            self.allocated[location] = self.allocated.get(location, 0) + int(nbytes)
        return ptr

    def free(self, ptr: int, location: Location) -> None:
        if location is not Location.DEVICE:
            super().free(ptr, location)

    def knows_pointer(self, ptr: int, nbytes: int, location: Location) -> bool | None:
        return None  # its addresses are counted, never backed: it cannot say which are valid

    def memcpy(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        self.op_count += 1  # counted as the host backend counts it, not run

    def memcpy_2d(self, dst: int, dpitch: int, src: int, spitch: int, width: int, height: int,
                  stream: int) -> None:
        self.op_count += 1  # counted as the host backend counts it, not run

    def memset(self, ptr: int, value: int, nbytes: int, stream: int) -> None:
        self.op_count += 1  # counted as the host backend counts it, not run

    def fill(self, ptr: int, pattern: bytes, count: int, stream: int) -> None:
        self.op_count += 1  # counted as the host backend counts it, not run

    def launch_host_func(self, stream: int, fn: Callable[[], None]) -> None:
        self.op_count += 1  # counted as the host backend counts it, not run

    def __repr__(self) -> str:
        return "DryRunBackend()"


def companion_deployment(cfg: LLMEngineConfig) -> DeploymentConfig:
    """A minimal deployment around a lone spec-decode base or draft config, so that its bindings can
    be laid out (which PipelineIO member each engine tensor binds to does not depend on the partner's
    sizes). Sizes of the partner are made up: use it for binding names, never for memory."""
    if cfg.role == "base":
        partner = LLMEngineConfig(
            hidden_size=cfg.hidden_size, vocab_size=cfg.output_vocab_size,
            max_supported_batch_size=cfg.max_supported_batch_size,
            max_supported_input_length=cfg.max_supported_input_length,
            max_kv_cache_capacity=cfg.max_kv_cache_capacity, num_attention_layers=1,
            num_attention_heads=cfg.num_attention_heads, num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
            rotary_dim=cfg.rotary_dim, activation_dtype=cfg.activation_dtype, kv_cache_dtype=cfg.kv_cache_dtype,
            base_model_hidden_size=cfg.hidden_size, max_draft_tree_size=cfg.max_verify_tree_size)
        spec = SpecDecodeConfig(cfg.hidden_size, cfg.hidden_size, cfg.max_verify_tree_size, cfg.max_verify_tree_size,
                                verify_size=cfg.max_verify_tree_size)
        return DeploymentConfig(cfg, partner, spec).validate()
    if cfg.role == "draft":
        partner = LLMEngineConfig(
            hidden_size=cfg.base_model_hidden_size, vocab_size=cfg.vocab_size,
            max_supported_batch_size=cfg.max_supported_batch_size,
            max_supported_input_length=cfg.max_supported_input_length,
            max_kv_cache_capacity=cfg.max_kv_cache_capacity, num_attention_layers=1,
            num_attention_heads=cfg.num_attention_heads, num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
            rotary_dim=cfg.rotary_dim, activation_dtype=cfg.activation_dtype, kv_cache_dtype=cfg.kv_cache_dtype,
            is_spec_decode_base=True, max_verify_tree_size=cfg.max_draft_tree_size)
        spec = SpecDecodeConfig(cfg.base_model_hidden_size, cfg.hidden_size, cfg.max_draft_tree_size,
                                cfg.max_draft_tree_size, verify_size=1)
        return DeploymentConfig(partner, cfg, spec).validate()
    return DeploymentConfig(cfg).validate()


def dry_run_setup(config: LLMEngineConfig | DeploymentConfig, *, backend: DryRunBackend | None = None,
                  engine_names: Mapping[str, str] | None = None) -> LLMSetup | SpecDecodeSetup:
    """``create_for_llm`` (a plain LLM) or ``create_for_spec_decode`` (a deployment with a draft) for
    ``config`` on a :class:`DryRunBackend`, bound to null-compute reference engines (named by role from
    ``engine_names``; default ``toy-llm``, ``toy-base``, ``toy-draft``). Close it after use.

    A lone spec-decode base or draft config is placed in a :func:`companion_deployment`.
    """
    from trtio.testing.reference_engine import ReferenceEngine  # noqa: PLC0415 - testing helper, loaded on use

    be = backend or DryRunBackend()
    names = {**_DEFAULT_NAMES, **(engine_names or {})}
    if isinstance(config, LLMEngineConfig):
        config = companion_deployment(config) if config.role != "llm" else DeploymentConfig(config).validate()
    if config.draft is None:
        base = config.base
        if base.role != "llm":
            raise ConfigError("base.is_spec_decode_base", "a deployment without a draft needs a plain LLM base "
                                                          "(is_spec_decode_base false)")
        engine = ReferenceEngine.from_config(base, null_compute=True, device="host", name=names["llm"])
        return create_for_llm(engine, base, backend=be)
    base_engine = ReferenceEngine.from_config(config.base, null_compute=True, device="host", name=names["base"])
    draft_engine = ReferenceEngine.from_config(config.draft, null_compute=True, device="host", name=names["draft"])
    return create_for_spec_decode(base_engine, draft_engine, config, backend=be)


def kv_state_rows(setup: LLMSetup | SpecDecodeSetup) -> list[dict[str, Any]]:
    """The KV state of each engine of ``setup``, one JSON-able dict per engine: ``role``, ``layout``
    (``"paged"`` or ``"contiguous"``), ``tensors`` (one per layer: a paged pool ``[2, pages, page, kv_heads,
    head_dim]`` or a contiguous K or V cache), ``shape`` and ``dtype`` of one of them, ``bytes`` (all of
    them), ``capacity`` (``max_kv_cache_capacity``), ``slots`` (sequence slots), ``round_width`` (entries a
    step writes past a sequence's length: :func:`trtio._tools.sequence_fit.round_width`), and for a paged state
    ``pool_pages``, ``page_size``, ``pages_per_sequence`` and ``page_table_shape`` (``[batch, 2,
    pages_per_sequence]``: K page ids, then V page ids)."""
    spec = setup.bundle.spec if isinstance(setup, SpecDecodeSetup) else None
    rows = []
    for e in setup.engines():
        state = e.state
        tensors = [t for name, t in state.tensors.items() if not is_recurrent_state(name)]
        row: dict[str, Any] = {
            "role": e.role,
            "layout": state.layout,
            "tensors": len(tensors),
            "names": [name for name in state.tensors if not is_recurrent_state(name)],
            "shape": [int(d) for d in tensors[0].shape] if tensors else [],
            "dtype": str(tensors[0].dtype) if tensors else None,
            "bytes": sum(t.capacity for t in tensors),
            "capacity": e.cfg.max_kv_cache_capacity,
            "slots": setup.io.max_batch,
            "round_width": round_width(e.role, spec),
        }
        if state.layout == "paged" and state.page_table is not None:
            row.update(pool_pages=int(state.pool_pages), page_size=int(state.page_size),
                       pages_per_sequence=int(state.pages_per_sequence),
                       page_table_shape=[int(d) for d in state.page_table.shape])
        if e.cfg.feature(HybridConfig) is not None:
            row["recurrent"] = recurrent_rows(setup, e)
        if e.cfg.feature(Gemma4Config) is not None:
            row["gemma4"] = gemma4_rows(setup, e)
        rows.append(row)
    return rows


def gemma4_rows(setup: LLMSetup | SpecDecodeSetup, e: BoundEngine) -> dict[str, Any]:
    """A Gemma 4 engine's KV pools, one per attention layer: ``layers`` (``name``, ``kind`` sliding / full,
    ``shape``, ``shares``: the donor's pool a KV-sharing consumer is bound to, else None), the ``bytes`` allocated
    (donors' pools once) and the SWA ``mode`` with its reason."""
    g, state = e.cfg.feature(Gemma4Config), e.state
    assert g is not None
    layers = []
    for i in range(g.num_layers):
        name = names.past_key_values(i)
        t = state.tensors[name]
        layers.append({"name": name, "kind": g.kinds[i], "shape": [int(d) for d in t.shape],
                       "shares": state.shared.get(name)})
    mode = state.kv_parts.get("swa_mode")
    return {"layers": layers, "bytes": state.nbytes, "mode": mode.describe() if mode is not None else "none"}


def recurrent_rows(setup: LLMSetup | SpecDecodeSetup, e: BoundEngine) -> dict[str, Any]:
    """A hybrid engine's recurrent state: ``kind``, ``layers`` (recurrent ones), ``rows`` (sequence slots), and per
    pool kind (``conv``, ``state``) the ``names``, one pool's ``shape`` and ``dtype`` and the ``bytes`` of all, and
    the snapshot pool's ``snapshot_rows`` (``max_prefixes``) and ``snapshot_bytes``."""
    hybrid, state = e.cfg.feature(HybridConfig), e.state
    assert hybrid is not None
    out: dict[str, Any] = {"kind": hybrid.recurrent_kind, "layers": hybrid.num_layers, "rows": state.max_batch}
    for key, template in (("conv", names.kConvStateTemplate), ("state", names.kRecurrentStateTemplate)):
        pools = {n: t for n, t in state.tensors.items() if is_recurrent_state(n) and n.startswith(template + "_")}
        first = next(iter(pools.values()))
        out[key] = {"names": list(pools), "shape": [int(d) for d in first.shape], "dtype": str(first.dtype),
                    "bytes": sum(t.capacity for t in pools.values())}
    rec = setup.recurrent if isinstance(setup, LLMSetup) else None
    out["snapshot_rows"] = rec.max_prefixes if rec is not None else 0
    out["snapshot_bytes"] = rec.nbytes if rec is not None else 0
    return out


def planned(config: DeploymentConfig, *,
            engine_names: Mapping[str, str] | None = None) -> tuple[MemoryReport, list[dict[str, Any]]]:
    """:func:`planned_memory` and :func:`kv_state_rows` of one dry run of ``config``."""
    if config.draft is None and config.base.role != "llm":
        raise ConfigError("base", f"describes a spec-decode {config.base.role} without its partner; plan the "
                                  f"deployment config that holds base, draft and spec")
    with dry_run_setup(config, engine_names=engine_names) as setup:
        report = setup.memory_report(include_context_memory=False)
        kv = kv_state_rows(setup)
        rank = config.base.feature(LoraConfig)
        lora = LoraInputs.from_engine(setup.executor.io, rank.max_lora_rank if rank is not None else 0) \
            if isinstance(setup, LLMSetup) else None
    if lora is not None:  # an adapter's device copy is made by set_lora: its worst case, planned
        report = MemoryReport.combine(report.title, [report, lora.worst_case_report()])
    report.notes.append("context memory: not included (device_memory_size_v2 of the real engines, shared by them)")
    return report, kv


def planned_memory(config: DeploymentConfig) -> MemoryReport:
    """What ``create_for_llm`` / ``create_for_spec_decode`` allocate for ``config``, tensor by tensor:
    PipelineIO, each engine's KV state (``[batch, kv_heads, capacity, head_dim]`` per layer on the batch
    contract; a paged pool ``[2, pages, page, kv_heads, head_dim]`` per layer and the page table on the
    ragged one), staging and the RoPE table. The engines' own context memory (``device_memory_size_v2``)
    depends on the plan and is left out."""
    return planned(config)[0]
