"""What the hybrid plugins (``causal_conv1d``, ``gated_delta_net``, ``update_ssm_state``) share: the resident state
pool's checks and the phases they model.

Read from Edge-LLM 0.11's ``cpp/plugins/utils/raggedPluginMetadata.h`` (``validateIndexedResidentStateDescriptors``):
a resident state pool is ``[rows, *trailing]`` of one dtype, its ``present`` output the same pool (the plugins check
``outputs[state] == inputs[state]``: the runtime binds both to one allocation). Each sequence ``s`` of a step reads and
writes pool row ``state_indices[s]`` in every phase; no plugin zeroes a row (``invokeMambaStateClear``, run by the
runtime at admission, is the only clear): a row left from an earlier sequence is read as it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from trtio.testing.edgellm_plugins._common import Phase, PluginInputError, resident_rows

__all__ = ["MAX_LINEAR_VERIFY", "MODELLED_PHASES", "checked_pool", "linear_verify", "refuse_unmodelled",
           "tree_nodes"]

# Prefill, chunked prefill, decode and a draft proposal: what these models compute, and the linear (MTP) verify of
# Gated DeltaNet and the causal conv where the engine was built for it. DDTree verify (tree inputs, replay stashes)
# and the diffusion phases (transactional state in the workspace) are refused by name.
MODELLED_PHASES = (Phase.CONTEXT_PREFILL, Phase.CONTEXT_CHUNK, Phase.AUTOREGRESSIVE_DECODE,
                   Phase.SPEC_DRAFT_PROPOSAL)
# kLinearSpecVerifyMaxSeqLen (causalConv1dPlugin.cpp, gatedDeltaNetPlugin.cpp; T_MAX_AOT of gdn_decode_mtp.py)
MAX_LINEAR_VERIFY = 16


def checked_pool(plugin: str, pool: np.ndarray, dtype: type, trailing: Sequence[int], state_indices: np.ndarray,
                 sequences: int) -> np.ndarray:
    """``validateIndexedResidentStateDescriptors`` on ``pool`` (``[rows, *trailing]`` of ``dtype``), then the rows
    ``state_indices`` names (``_common.resident_rows``: in the pool, one a sequence)."""
    want = tuple(int(t) for t in trailing)
    if pool.dtype != np.dtype(dtype) or pool.ndim != len(want) + 1 or pool.shape[0] <= 0 \
            or tuple(pool.shape[1:]) != want:
        raise PluginInputError(f"{plugin} indexed resident state: the pool is {pool.dtype} {list(pool.shape)}, the "
                               f"kernel contract [rows, {', '.join(map(str, want))}] {np.dtype(dtype)}")
    return resident_rows(plugin, np.asarray(state_indices), sequences, int(pool.shape[0]))


def linear_verify(plugin: str, phase: Phase, attrs: dict[str, Any], width: int) -> bool:
    """Whether the step is the linear spec-verify (``mtpActive`` in the plugins' ``enqueue``): phase 5 on a node built
    with ``use_mtp`` (and no ``use_ddtree``, refused before). Phase 5 without the flag is refused as the C++ refuses it
    ("SPEC_TARGET_VERIFY requires verify-capable engine metadata"), and so is a width outside [1, 16]."""
    if phase is not Phase.SPEC_TARGET_VERIFY:
        return False
    if not int(attrs.get("use_mtp") or 0):
        raise PluginInputError(f"{plugin}: SPEC_TARGET_VERIFY requires verify-capable engine metadata (use_mtp)")
    if not 1 <= width <= MAX_LINEAR_VERIFY:
        raise PluginInputError(f"{plugin}: linear spec-verify kernel supports seq_len in [1, {MAX_LINEAR_VERIFY}], "
                               f"got {width}")
    return True


def tree_nodes(plugin: str, parents: np.ndarray, depths: np.ndarray) -> list[list[int] | None]:
    """A DDTree verify's nodes of one sequence (``tree_parent_ids`` / ``tree_depths``: its W entries, parents as
    indices within the sequence): each node's root-to-node path, or None for a padding node. The kernels' rules
    (``causalConv1dDecodeDDTreeKernel``: a root is node 0 with parent -1 and depth 0, a child points at an earlier
    node and has a positive depth; ``buildAncestorMasksKernel`` in ``gdnTreeChunkKernels.cu``: node 0 must be the
    root, every other node point at an earlier one) treat any other node as padding, silently: the runtime marks
    padding with parent -1 (``prepareSpecRaggedMetadataKernel``), so a node 0 that is not a root, a parent at or
    after its node, or a depth other than the node's path length is refused here."""
    nodes: list[list[int] | None] = []
    for n, (parent, depth) in enumerate(zip(parents.tolist(), depths.tolist())):
        if n > 0 and parent == -1:
            nodes.append(None)
            continue
        if (n == 0 and parent >= 0) or (n > 0 and not 0 <= parent < n):
            raise PluginInputError(f"{plugin}: tree node {n} has parent {parent}: the kernels take it for padding "
                                   "(node 0 is the root, every other node's parent an earlier node, padding -1)")
        path = [n] if n == 0 else [*_parent_path(nodes, parent, plugin, n), n]
        if depth != len(path) - 1:
            raise PluginInputError(f"{plugin}: tree node {n} has depth {depth}, its path from the root "
                                   f"{len(path) - 1}: the conv kernel walks depth + 1 nodes")
        nodes.append(path)
    return nodes


def _parent_path(nodes: list[list[int] | None], parent: int, plugin: str, node: int) -> list[int]:
    found = nodes[parent]
    if found is None:
        raise PluginInputError(f"{plugin}: tree node {node}'s parent {parent} is a padding node: the kernels' walk "
                               "stops there (a truncated path)")
    return found


def refuse_unmodelled(plugin: str, phase: Phase, what: str = "") -> None:
    """A phase these models do not compute (verify, the diffusion phases): refused rather than guessed."""
    if phase not in MODELLED_PHASES:
        raise PluginInputError(f"{plugin}: phase {int(phase)} ({phase.name}){what} is a mode this numpy model does "
                               "not compute")
