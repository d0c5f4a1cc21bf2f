"""A LoRA engine's part of an LLM setup (``docs/architecture.md``, "LoRA adapters"): its adapter inputs, bound first
to empty tensors (no adapter), and ``set_lora`` / ``lora``, the setup's calls that rebind them
(:class:`~trtio.families.lora.adapters.LoraSlots`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trtio._engine import EngineIO
from trtio._memory import MemoryReport
from trtio._setups.binding import BindContext, BoundEngine
from trtio._stream import Stream
from trtio._tensor import Tensor
from trtio.errors import ConfigError, InvalidTypeError
from trtio.families.lora.adapters import LoraAdapter, LoraInputs, LoraSlots
from trtio.features import Feature

__all__ = ["LoraFeature"]


class LoraFeature(Feature):
    """The LoRA inputs of an LLM setup's engine: ``lora`` (the setup's attribute) is the adapter set, and
    :meth:`set_lora` the setup's call."""

    ATTRIBUTES = {"lora": None}
    METHODS = ("set_lora",)

    def __init__(self, slots: LoraSlots) -> None:
        self._slots = slots

    @classmethod
    def make(cls, config: Any, cfg: Any, role: str, ctx: BindContext, eio: EngineIO) -> LoraFeature | None:
        if role != "llm":  # only an LLM setup binds adapters (a spec pair's engines are refused: LoraConfig)
            return None
        inputs = LoraInputs.from_engine(eio, config.max_lora_rank)  # refused here where they cannot bind
        if inputs is None:
            return None
        return cls(ctx.stack.enter_context(LoraSlots(inputs, ctx.backend)))

    def constants(self) -> Mapping[str, Tensor]:
        """Every LoRA input, bound first to an empty tensor (no adapter); :meth:`set_lora` rebinds them."""
        return self._slots.tensors

    def bound(self, engine: BoundEngine, ctx: BindContext) -> None:
        self._slots.attach(engine.tensor_map, engine.executor)

    def attribute(self, name: str) -> LoraAdapter | None:
        return self._slots.adapter

    def set_lora(self, adapter: LoraAdapter | None, stream: Stream) -> None:
        """Check ``adapter`` (one set before was checked then) and bind it for the steps after this call."""
        if adapter is not None and not self._slots.knows(adapter):
            self._slots.inputs.check(adapter, "set_lora")
        # The tensor map's LoRA inputs rebound: the executor takes the plans (and graphs) of this adapter's binding
        # set at the next step; the last decode's plan (dims, device work) holds, an adapter changing no slot.
        self._slots.use(adapter, stream)

    @classmethod
    def absent_call(cls, name: str, adapter: Any, engine: str) -> None:
        """``set_lora`` on a setup whose engine takes no adapter: None is nothing to do; an adapter is refused."""
        if adapter is None:
            return
        if not isinstance(adapter, LoraAdapter):
            raise InvalidTypeError(f"set_lora: expected a trtio.LoraAdapter or None, got {type(adapter).__name__}")
        raise ConfigError("max_lora_rank", f"set_lora: engine {engine!r} takes no LoRA adapter (its config's "
                                           "max_lora_rank is 0: build it with --max-lora-rank)")

    def reports(self) -> list[MemoryReport]:
        return [self._slots.report()]

