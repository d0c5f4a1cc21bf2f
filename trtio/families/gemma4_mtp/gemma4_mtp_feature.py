"""A Gemma 4 assistant's part of a spec-decode setup (:class:`~trtio.features.Feature`): its ``past_key_values_i``
bound to the target's pools its ``kv_sharing_map`` names (zero-copy: the target's tensors, read through the target's
page-table rows each step), and the setup's ``draft_prefill`` / ``draft_propose`` / ``draft_accept`` run as the
assistant's steps (:mod:`trtio.families.gemma4_mtp.assistant`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from trtio import names
from trtio._setups.base import Prompt
from trtio._setups.binding import BindContext
from trtio._setups.draft_prompt import DraftRound
from trtio._stream import StreamLike
from trtio._tensor import Tensor
from trtio.errors import BindingError, InvalidValueError
from trtio.families.gemma4_mtp.assistant import AssistantDraft
from trtio.families.gemma4_mtp.gemma4_mtp_config import Gemma4MtpConfig
from trtio.features import Feature

__all__ = ["Gemma4MtpFeature"]


class Gemma4MtpFeature(Feature):
    """A Gemma 4 assistant draft's part (module docstring)."""

    METHODS = ("draft_prefill", "draft_propose", "draft_accept")

    def __init__(self, pools: Mapping[str, Tensor], draft: AssistantDraft, steps: int) -> None:
        self._pools = dict(pools)
        self.draft = draft
        self._limit = steps

    @classmethod
    def make(cls, config: Gemma4MtpConfig, cfg: Any, role: str, ctx: BindContext, eio: Any) -> Gemma4MtpFeature | None:
        if role != "draft":
            return None
        base = ctx.engines.get("base")
        if base is None or ctx.bundle is None or ctx.bundle.spec is None:
            raise BindingError(eio.name, ["a Gemma 4 assistant is bound after its target, in a spec-decode setup: "
                                          "create_for_spec_decode(base, draft, bundle)"])
        problems = []
        pools = {}
        for i, t in enumerate(config.targets):
            name, target = names.past_key_values(i), names.past_key_values(t)
            found = base.state.tensors.get(target)
            if found is None:
                problems.append(f"{name}: kv_sharing_map names target layer {t}, whose pool {target} the base does "
                                "not own")
                continue
            if name in eio:
                declared = eio[name].shape
                if tuple(declared[2:]) != tuple(found.shape[2:]):
                    problems.append(f"{name}: the engine reads [2, pages, {list(declared[2:])}], target layer {t}'s "
                                    f"pool is {list(found.shape)}")
            pools[name] = found
        io = ctx.io
        width = cfg.base_model_hidden_size
        item = io.draft_hidden_states_out.dtype.itemsize
        rows = io.draft_hidden_states_out.capacity // (width * item)
        if rows < 2 * io.max_batch:
            problems.append(f"{names.kOutputHiddenStates}: the PipelineIO keeps {rows} rows of {width}, a Gemma 4 "
                            f"assistant needs {2 * io.max_batch} (a step's and one parked row a slot)")
        if problems:
            raise BindingError(eio.name, problems)
        return cls(pools, AssistantDraft(width, item, io.max_batch), ctx.bundle.spec.drafting_step)

    def constants(self) -> Mapping[str, Any]:
        return self._pools

    def check_pin(self, what: str) -> None:
        raise InvalidValueError(f"{what}: a Gemma 4 MTP pair keeps no prefix: its assistant owns no KV pages (it "
                                "reads the target's pools through the target's page-table rows), and a prefix pins "
                                "pages in each engine's own pool; prefix reuse for a KV-less draft is not bound "
                                "(docs/edgellm-assumptions.md §18.7)")

    def draft_prefill(self, r: DraftRound, pending: Prompt, inputs_embeds: Any, context_lengths: Any, slots: Any,
                      prefix: Any, stream: StreamLike = None) -> Tensor:
        return self.draft.prefill(r, pending, inputs_embeds, context_lengths, slots, prefix, stream)

    def draft_propose(self, r: DraftRound, b: int, inputs_embeds: Any, parents: Any,
                      stream: StreamLike = None) -> Tensor:
        return self.draft.propose(r, b, inputs_embeds, parents, self._limit, stream)

    def draft_accept(self, r: DraftRound, b: int, acc: np.ndarray, lens: list[int], rows: np.ndarray,
                     inputs_embeds: Any, accept_lengths: Any, stream: StreamLike = None) -> Tensor:
        return self.draft.accept(r, b, acc, lens, rows, inputs_embeds, accept_lengths, stream)
