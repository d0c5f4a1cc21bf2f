"""DSpark (Edge-LLM 0.11 ``spec_decode_type: dspark``): read and its bindings declared, the pair refused at
``create_for_spec_decode`` naming what trtio lacks (``docs/edgellm-assumptions.md`` §11.10).

A DSpark draft is a JetSpec-style block draft (``dflash_target_hidden_concat``, the ``dflash_delta_*`` inputs, a
block in tree mode) that also returns ``dspark_hidden_states [T, H]`` (:data:`DSPARK` declares both: its config
block ``dspark_config``, its base a DFlash base of ``dspark_config.target_layer_ids``), and its runtime
(``dsparkDecoder.cpp``) does not take the block's argmax: ``dsparkBiasMarkovGreedy`` runs one step at a time, adding
to step ``k``'s draft logits a rank-``markov_rank`` bigram bias of the token chosen before it
(``dsparkBuildMarkovLogits``: ``markov_w1 [V, r]``, ``markov_w2 [V, r]`` of ``dspark_config.heads_file``,
``dspark_heads.safetensors``), and a confidence head (``confidence_weight [H (+ r)]``, ``confidence_bias [1]``, over
``dspark_hidden_states``) picks how many of the block's guesses to verify. Those heads live in sidecar files beside
the engines and act between the draft's logits and the verify tree: trtio's phases return the block's raw logits and
have no step that applies them, and the sidecars' ``dspark_heads_info.json`` names the training checkpoint, not the
heads' math. trtio refuses the pair rather than draft from unbiased logits (which would verify different tokens than
Edge-LLM's runtime).

Divergence noted for whoever binds it: Edge-LLM 0.11's builder, run on a DSpark export, writes
``contiguous_query_swa: true`` with a 64-token window for the draft, while the exported draft's attention plugin has
``sliding_window_size: -1`` and ``enable_contiguous_query_swa: 0`` (full attention). The graph is what runs; a
binding must follow it (no window) and say so.
"""

from __future__ import annotations

from trtio import names
from trtio.families.spec.block_family import BlockFamily, declare

__all__ = ["DSPARK", "DSPARK_MISSING"]

#: Why trtio refuses a DSpark pair: what its runtime does that trtio has no step for.
DSPARK_MISSING = ("its runtime (dsparkDecoder) biases each draft step's logits with the Markov head of the previous "
                  "token (markov_w1 / markov_w2 of dspark_config.heads_file, dspark_heads.safetensors) and picks how "
                  "many guesses to verify with the confidence head (confidence_weight / confidence_bias over "
                  "dspark_hidden_states); trtio has no step that loads those sidecars or applies the heads, so it "
                  "would draft from unbiased logits")

#: DSpark's block draft: ``dspark_config``, ``dspark_tree_base``, ``dspark_hidden_states``; refused. (Its block's mask
#: is ``dspark_config.causal_head``'s, ``dsparkDecoder.h``: ``mCausalProposalMask``; trtio writes none: refused.)
DSPARK = declare(BlockFamily("dspark", "dspark_config", "dspark_tree_base", causal=False,
                             outputs=(names.kDSparkHiddenStates,), refused=DSPARK_MISSING))
