"""JetSpec: a causal DFlash (Edge-LLM 0.11 ``spec_decode_type: jetspec``; ``docs/edgellm-assumptions.md`` §11.9).

A JetSpec pair is a DFlash pair whose draft was trained with a causal block (``jetspec_config.causal_head: true``).
Edge-LLM's exporter writes the same graphs (the base: a DFlash base, ``hidden_states [T, 3H]`` of
``jetspec_config.target_layer_ids``; the draft: the ``dflash_draft`` graph, its attention plugin in tree mode reading
``packed_attention_mask`` and ``attention_position_ids``), and its runtime runs both with ``DFlashDecoder``
(``cpp/runtime/decoding/decoderRegistry.cpp``: ``SpecDecodeMode::kJetSpec``). The one difference is the proposal
mask ``dflashPrepareProposalInputsKernel`` writes for the block (``cpp/kernels/speculative/dflashRuntimeKernels.cu``):
row ``i`` sees the committed tokens and block rows ``0 .. i`` (``bit <= i``) where DFlash's sees the whole block; the
block's positions are the same (``attention_position_ids = positions = committed + i``), and the rounds are DFlash's
(the delta of the accepted path, then the next block: :mod:`trtio.families.spec.dflash`).

``makeCachedBlockDraftRuntimeConfig`` (``dflashDecodeUtils.cpp``) refuses a JetSpec pair unless both configs say
``causal_head: true``; Edge-LLM's exporter and runtime read a JetSpec checkpoint's ``dflash_config`` where it has no
``jetspec_config`` (``config.py::make_jetspec_draft_config``). trtio declares the same.
"""

from __future__ import annotations

from trtio.families.spec.block_family import BlockFamily, declare

__all__ = ["JETSPEC"]

#: JetSpec's block draft: ``jetspec_config`` (or ``dflash_config``), ``jetspec_tree_base``, a causal block.
JETSPEC = declare(BlockFamily("jetspec", "jetspec_config", "jetspec_tree_base", causal=True,
                              also_reads=("dflash_config",), required={"causal_head": True}))
