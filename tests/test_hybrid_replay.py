"""Gated DeltaNet's replay commit (``trtio.families.hybrid.replay``): an accept of a DDTree base advances each
sequence's slot state along its accepted path from the stash Edge-LLM's tree verify leaves at the head of the
sequence's ``intermediate_recurrent_state_j`` rows (``gdnTreeChunkKernels.{h,cu}``: per node ``[L2-normalised k FP32
Hk x Dk | g FP32 Hv | beta FP32 Hv | v FP16 Hv x Dv]``; per node in path order ``S = g S; v' = beta (v - S^T k); S +=
k v'^T``, value head j reading key head ``j // (Hv / Hk)``).

The host backend's commit is checked against a plain loop written here from those lines; the cuda kernel against the
host backend's commit (gpu-marked: it has not run in CI, which has no GPU), also replayed from a CUDA graph with
paths staged after the capture. The parity test through the real graph is ``tests/test_parity_dflash.py``
(``test_a_hybrid_base_equals_hugging_face``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from _host_kernels import kernels_on_host

from trtio._cuda.backend import Backend, Location, get_backend
from trtio._stream import Stream
from trtio._tensor import Tensor
from trtio.families.hybrid.hybrid_config import HybridConfig
from trtio.families.hybrid.replay import MAX_ACCEPT, MAX_NODES, GdnReplay, tree_problem

HV, HK, DK, DV = 4, 2, 8, 8  # value heads, key heads (GQA: two value heads a key head), key and value dims
LAYERS, POOL_ROWS, MAX_BATCH, W = 2, 5, 4, 6


def _config() -> HybridConfig:
    return HybridConfig(recurrent_kind="gated_deltanet", conv_dim=2 * HK * DK + HV * DV, conv_kernel=4,
                        recurrent_state_num_heads=HV, recurrent_state_head_dim=DK, recurrent_state_size=DV,
                        recurrent_state_dtype="float32", layers=tuple(range(LAYERS)))


def _fields(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One node's update: keys [Hk, Dk] (L2-normalised), gate and beta [Hv] in (0, 1), values [Hv, Dv] (FP16)."""
    k = rng.standard_normal((HK, DK)).astype(np.float32)
    k /= np.sqrt((k * k).sum(axis=1, keepdims=True))
    g = rng.uniform(0.5, 1.0, HV).astype(np.float32)
    beta = rng.uniform(0.1, 1.0, HV).astype(np.float32)
    v = rng.standard_normal((HV, DV)).astype(np.float16)
    return k, g, beta, v


def _cell(k: np.ndarray, g: np.ndarray, beta: np.ndarray, v: np.ndarray) -> bytes:
    """Edge-LLM's stash cell (stashOffsets), packed byte by byte."""
    return k.tobytes() + g.tobytes() + beta.tobytes() + v.tobytes()


def _advance(state: np.ndarray, k: np.ndarray, g: np.ndarray, beta: np.ndarray, v: np.ndarray) -> None:
    """One node of the replay, head by head, column by column (``gdnTreeReplayCommitBatched``'s order of sums)."""
    for j in range(HV):
        key = k[j // (HV // HK)]
        for col in range(DV):
            column = state[j, :, col] * g[j]
            seen = np.float32(0)
            for r in range(DK):
                seen += column[r] * key[r]
            new = (np.float32(v[j, col]) - seen) * beta[j]
            state[j, :, col] = column + key * new


def _scene(seed: int) -> dict[str, Any]:
    """Pools, stash buffers, the fields of every node and an accept of three sequences (slots 3, 0, 4): paths of 4,
    1 and 3 nodes through a tree of W nodes a sequence."""
    rng = np.random.default_rng(seed)
    pools = [rng.standard_normal((POOL_ROWS, HV, DK, DV)).astype(np.float32) for _ in range(LAYERS)]
    stash = [np.full((MAX_BATCH * W, HV, DK, DV), np.nan, np.float32) for _ in range(LAYERS)]
    fields = [[[_fields(rng) for _ in range(W)] for _ in range(3)] for _ in range(LAYERS)]
    for layer in range(LAYERS):
        raw = stash[layer].reshape(MAX_BATCH, -1).view(np.uint8)
        for s in range(3):
            cells = b"".join(_cell(*fields[layer][s][n]) for n in range(W))
            raw[s, :len(cells)] = np.frombuffer(cells, np.uint8)
    paths = [[0, 1, 3, 5], [0], [0, 2, 4]]
    slots = np.array([3, 0, 4], np.int64)
    lengths = np.array([len(p) for p in paths], np.int64)
    rows = np.full((3, 4), -1, np.int64)
    for s, p in enumerate(paths):
        rows[s, :len(p)] = [s * W + n for n in p]
    want = [p.copy() for p in pools]
    for layer in range(LAYERS):
        for s, p in enumerate(paths):
            for node in p:
                _advance(want[layer][slots[s]], *fields[layer][s][node])
    return dict(pools=pools, stash=stash, slots=slots, rows=rows, lengths=lengths, want=want)


def _device(backend: Backend, values: np.ndarray, stream: Stream) -> Tensor:
    t = Tensor.empty(values.shape, values.dtype, Location.DEVICE, backend=backend)
    t.copy_from(values, stream)
    return t


def _commit(backend: Backend, scene: dict[str, Any]) -> list[np.ndarray]:
    """The scene's accept through GdnReplay on ``backend``: every layer's pool after it."""
    s = Stream.create(backend)
    pools = [_device(backend, p, s) for p in scene["pools"]]
    stash = [_device(backend, t, s) for t in scene["stash"]]
    with GdnReplay(_config(), MAX_BATCH, backend=backend, name="test") as replay:
        replay.attach(pools, stash, s)
        s.synchronize()
        allocs, syncs = backend.alloc_count, backend.sync_count
        replay.commit(scene["slots"], scene["rows"], scene["lengths"], W, s)
        assert (backend.alloc_count, backend.sync_count) == (allocs, syncs)  # no allocation, no host sync
        s.synchronize()
        return [p.to_numpy() for p in pools]


def test_the_replay_advances_each_slot_along_its_accepted_path() -> None:
    """Three sequences of a DDTree base, two layers, two value heads a key head: each slot's state is its pool row
    advanced along the accepted nodes of its own stash; the other slots (1, 2) keep theirs."""
    scene = _scene(0)
    got = _commit(get_backend("host"), scene)
    for layer in range(LAYERS):
        np.testing.assert_allclose(got[layer], scene["want"][layer], rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(got[layer][[1, 2]], scene["pools"][layer][[1, 2]])


@pytest.fixture(params=["kernels", pytest.param("cuda", marks=pytest.mark.gpu)])
def kernel_backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Backend:
    """A backend that runs the kernel: trtio_gdn_replay built for the CPU and launched as on a GPU
    (tests/_host_kernels.py), and the cuda backend where a GPU answers."""
    if request.param == "kernels":
        return kernels_on_host(monkeypatch)
    return get_backend("cuda")


def test_the_kernel_equals_the_host_commit(kernel_backend: Backend) -> None:
    """The device kernel (trtio_gdn_replay) against the host backend's numpy commit on the same scene."""
    scene = _scene(2)
    host = _commit(get_backend("host"), scene)
    device = _commit(kernel_backend, scene)
    for layer in range(LAYERS):
        np.testing.assert_allclose(device[layer], host[layer], rtol=1e-5, atol=1e-5)


def test_a_captured_replay_reads_the_paths_staged_after_the_capture(kernel_backend: Backend) -> None:
    """The kernel reads the slots, lengths and nodes from the device block when it runs: a CUDA graph captured over
    one accept's launch, replayed after another accept's paths were staged, commits the other accept."""
    be = kernel_backend
    scene = _scene(3)
    s = Stream.create(be)
    pools = [_device(be, p, s) for p in scene["pools"]]
    stash = [_device(be, t, s) for t in scene["stash"]]
    with GdnReplay(_config(), MAX_BATCH, backend=be, name="test") as replay:
        replay.attach(pools, stash, s)
        lengths = np.ones(3, np.int64)
        replay.commit(scene["slots"], scene["rows"][:, :1], lengths, W, s)  # roots only: the launch for 3
        s.synchronize()
        for p, values in zip(pools, scene["pools"]):
            p.copy_from(values, s)
        launch = replay._launch(3, replay._paths.tensors["replay_paths"])
        be.begin_capture(s.handle)
        launch(s.handle)
        graph = be.end_capture(s.handle)
        try:
            replay._paths.write("replay_paths", _staged(scene))
            replay._paths.upload(s)
            be.launch_graph(graph, s.handle)
            s.synchronize()
        finally:
            be.destroy_graph(graph)
        for layer in range(LAYERS):
            np.testing.assert_allclose(pools[layer].to_numpy(), scene["want"][layer], rtol=1e-5, atol=1e-5)


def _staged(scene: dict[str, Any]) -> np.ndarray:
    """The scene's accept as GdnReplay stages it: [slot, first row, length, 0, nodes...] a sequence."""
    out = np.full((3, 4 + MAX_ACCEPT), -1, np.int32)
    for s in range(3):
        n = int(scene["lengths"][s])
        out[s, :4] = [scene["slots"][s], s * W, n, 0]
        out[s, 4:4 + n] = scene["rows"][s, :n] - s * W
    return out


def _chain(n: int) -> np.ndarray:
    return np.arange(-1, n - 1)[None, :]


@pytest.mark.parametrize("parents, fits", [
    (_chain(MAX_ACCEPT), True),  # a path of 16 nodes: the commit's most
    (_chain(MAX_ACCEPT + 1), False),  # 17: Edge-LLM's commit would skip it
    (np.array([[-1] + [0] * (MAX_NODES - 1)]), True),  # 64 nodes, two levels
    (np.array([[-1] + [0] * MAX_NODES]), False),  # 65 nodes: the verify refuses them
], ids=["chain-16", "chain-17", "star-64", "star-65"])
def test_trees_past_edge_llms_limits_are_named(parents: np.ndarray, fits: bool) -> None:
    problem = tree_problem(parents, np.ones(parents.shape, bool))
    assert (problem is None) == fits
    if not fits:
        assert "kGDN_TREE_CHUNK_MAX" in str(problem)
