"""``trtio._ops.copy_rows``, the row gather every step helper's graph holds (RoPE rows, hidden-state rows of
accepted nodes, a draft level's parent rows), against numpy on the host backend and on the GPU: rows of
every alignment (whole 16-byte words, 4-byte words, odd bytes) and rows wider than one block copies."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest
from _host_kernels import host_kernels_and_cuda  # noqa: F401  (the module's backend fixture)

from trtio import DType, Location, Stream, Tensor
from trtio._cuda.backend import Backend
from trtio._ops import copy_pages, copy_rows


def _device(backend: Backend, values: np.ndarray, name: str, stream: Stream) -> Tensor:
    """``values`` on the device, uploaded on ``stream`` (the test's: the work after it runs there, unordered with
    any other stream)."""
    t = Tensor.empty(values.shape, values.dtype, Location.DEVICE, backend=backend, name=name)
    t.copy_from(values, stream)
    return t


def _expected(dst: np.ndarray, src: np.ndarray, src_rows: np.ndarray, dst_rows: np.ndarray | None) -> np.ndarray:
    out = dst.copy()
    for i, s in enumerate(src_rows):
        d = i if dst_rows is None else dst_rows[i]
        if d >= 0:
            out[d] = 0 if s < 0 else src[s]
    return out


@pytest.mark.parametrize("row_bytes", [6, 20, 48, 512, 8192 + 48, 3 * 8192])
@pytest.mark.parametrize("scatter", [False, True])
def test_copy_rows_equals_the_numpy_gather(backend: Backend, row_bytes: int, scatter: bool) -> None:
    """Row ``dst_rows[i]`` (``i`` without them) of the destination becomes row ``src_rows[i]`` of the
    source, zeros for a negative source row; a negative destination row is skipped; every other byte
    stays as it was."""
    rng = np.random.default_rng(row_bytes)
    src_cap, dst_cap, count = 9, 11, 7
    src = rng.integers(0, 256, (src_cap, row_bytes), dtype=np.uint8)
    dst = rng.integers(0, 256, (dst_cap, row_bytes), dtype=np.uint8)
    src_rows = rng.integers(0, src_cap, count).astype(np.int32)
    src_rows[2] = -1  # zeros
    dst_rows = rng.permutation(dst_cap)[:count].astype(np.int32) if scatter else None
    if dst_rows is not None:
        dst_rows[4] = -1  # skipped
    s = Stream.create(backend)
    ts = [_device(backend, src, "src", s), _device(backend, dst, "dst", s),
          _device(backend, src_rows, "src_rows", s)]
    if dst_rows is not None:
        ts.append(_device(backend, dst_rows, "dst_rows", s))
    try:
        copy_rows(ts[1], ts[0], ts[2], count, row_bytes=row_bytes, stream=s,
                  dst_rows=ts[3] if dst_rows is not None else None)
        got = ts[1].to_numpy(s)
        np.testing.assert_array_equal(got, _expected(dst, src, src_rows, dst_rows))
        assert not np.array_equal(got, dst), "the copy moved something"
    finally:
        for t in ts:
            t.close()
        s.close()


def test_a_row_index_outside_a_tensor_is_refused_on_the_host_and_skipped_on_the_gpu(backend: Backend) -> None:
    """An index is data the device reads when the work runs: the host backend raises, naming it; a kernel
    skips the row rather than fault (checking would synchronise the host)."""
    src = np.arange(4 * 16, dtype=np.uint8).reshape(4, 16)
    dst = np.zeros((3, 16), np.uint8)
    rows = np.array([1, 7, 2], np.int32)  # 7: past the source's 4 rows
    s = Stream.create(backend)
    ts = [_device(backend, src, "src", s), _device(backend, dst, "dst", s), _device(backend, rows, "src_rows", s)]
    try:
        if backend.name == "host":
            with pytest.raises(ValueError, match="source row 7 at index 1 is outside the 4 rows"):
                copy_rows(ts[1], ts[0], ts[2], 3, row_bytes=16, stream=s)
        else:
            copy_rows(ts[1], ts[0], ts[2], 3, row_bytes=16, stream=s)
            np.testing.assert_array_equal(ts[1].to_numpy(s), np.stack([src[1], dst[1], src[2]]))
    finally:
        for t in ts:
            t.close()
        s.close()


def test_rows_are_bytes_whatever_the_dtype(backend: Backend) -> None:
    """A float16 tensor's rows move as bytes: NaN payloads and negative zeros arrive unchanged."""
    src = np.array([[np.nan, -0.0, 1.5, -np.inf], [65504.0, 6e-8, -2.0, 0.0]], np.float16)
    src.view(np.uint16)[0, 0] = 0x7E01  # a NaN with a payload
    dst = np.ones((2, 4), np.float16)
    s = Stream.create(backend)
    ts = [_device(backend, src, "src", s), _device(backend, dst, "dst", s),
          _device(backend, np.array([1, 0], np.int32), "src_rows", s)]
    try:
        assert ts[0].dtype is DType.FLOAT16
        copy_rows(ts[1], ts[0], ts[2], 2, row_bytes=8, stream=s)
        np.testing.assert_array_equal(ts[1].to_numpy(s).view(np.uint16), src[::-1].view(np.uint16))
    finally:
        for t in ts:
            t.close()
        s.close()


def test_copy_jobs_make_what_their_copies_make_one_by_one(backend: Backend) -> None:
    """One kernel for several independent copies (a step's RoPE rows, hidden rows, embeddings and zeros):
    the same bytes as each copy alone, for jobs of different row counts and widths (a wide row spread
    over blocks, many narrow rows, a long zeroing) and more jobs than one launch takes."""
    from trtio._cuda.kernels import MAX_COPY_JOBS
    from trtio._ops import Copy2D, CopyJobs, RowCopy, Zero, fuse

    rng = np.random.default_rng(5)
    s = Stream.create(backend)
    owned: list[Tensor] = []

    def dev(values: np.ndarray, name: str) -> Tensor:
        owned.append(_device(backend, values, name, s))
        return owned[-1]

    try:
        copies: list = []
        expected: list[tuple[Tensor, np.ndarray]] = []
        for n, (rows, width) in enumerate([(3, 8192 * 2 + 64), (40, 48), (5, 20), (9, 512), (2, 16)]):
            src = rng.integers(0, 256, (rows + 2, width), dtype=np.uint8)
            dst = rng.integers(0, 256, (rows + 1, width), dtype=np.uint8)
            idx = rng.integers(-1, rows + 2, rows).astype(np.int32)
            to = rng.permutation(rows + 1)[:rows].astype(np.int32)
            d = dev(dst, f"dst{n}")
            copies.append(RowCopy(d, dev(src, f"src{n}"), dev(idx, f"idx{n}"), rows, width, dev(to, f"to{n}")))
            expected.append((d, _expected(dst, src, idx, to)))
        plain = rng.integers(0, 256, (4, 96), dtype=np.uint8)
        wide = dev(rng.integers(0, 256, (4, 160), dtype=np.uint8), "wide")
        src2d = dev(plain, "plain")
        copies.append(Copy2D(backend, wide.data_ptr + 32, 160, src2d.data_ptr, 96, 96, 4))
        want = wide.to_numpy(s).copy()
        want[:, 32:128] = plain
        expected.append((wide, want))
        zeros = dev(rng.integers(1, 256, 3 * 8192 + 16, dtype=np.uint8), "zeros")
        copies.append(Zero(zeros, 2 * 8192 + 16))
        want = zeros.to_numpy(s).copy()
        want[:2 * 8192 + 16] = 0
        expected.append((zeros, want))
        works = fuse(copies)
        assert len(copies) > MAX_COPY_JOBS and len(works) == 2 and all(isinstance(w, CopyJobs) for w in works)
        for w in works:
            w.enqueue(s)
        for t, want in expected:
            np.testing.assert_array_equal(t.to_numpy(s), want, err_msg=t.name)
    finally:
        for t in owned:
            t.close()
        s.close()


def test_copy_jobs_refuse_copies_that_touch_what_another_writes(host: Backend) -> None:
    """Copies in one kernel run at once: one that writes what another reads or writes is refused when the
    work is made, naming both; and only copies fuse."""
    from trtio._ops import CopyJobs, RowCopy, Zero, fuse

    s = Stream.default(host)
    a = _device(host, np.zeros((4, 16), np.uint8), "a", s)
    b = _device(host, np.zeros((4, 16), np.uint8), "b", s)
    rows = _device(host, np.arange(4, dtype=np.int32), "rows", s)
    try:
        with pytest.raises(ValueError, match="copy 1 writes memory that copy 0 reads"):
            CopyJobs((RowCopy(b, a, rows, 4, 16), Zero(a, 16)))
        with pytest.raises(ValueError, match="copy 0 writes memory that copy 1 reads or writes"):
            CopyJobs((RowCopy(b, a, rows, 4, 16), RowCopy(b, rows, rows, 1, 16)))
        assert len(fuse([RowCopy(b, a, rows, 4, 16)])) == 1
        with pytest.raises(TypeError, match="str is not a copy"):
            fuse(["work"])
    finally:
        for t in (a, b, rows):
            t.close()


def test_copy_jobs_compare_the_rows_strided_copies_touch(host: Backend) -> None:
    """A hybrid model's accept commits, per sequence, one row of every layer's evenly spaced state pools (its slot's)
    from the verify's states: the copies of two sequences interleave (each one's rows lie between the other's) and
    fuse, as do its conv and recurrent pools laid out in turn. Copies whose rows truly share a byte are refused,
    whatever their pitches: the exact rows, not the span from a copy's first byte to its last."""
    from trtio._ops import Copy2D, CopyJobs, Zero2D

    pool, row, layers = 1 << 20, 64, 4  # 4 layers' pools of 4 slots, conv and recurrent pools in turn
    conv, rec = [pool + 2 * j * 4 * row for j in range(layers)], [pool + (2 * j + 1) * 4 * row for j in range(layers)]
    inter = 1 << 24  # the verify's states: [layers, rows of the step, row]

    def commit(pools: list[int], slot: int, node: int) -> Copy2D:
        return Copy2D(host, pools[0] + slot * row, pools[1] - pools[0], inter + node * row, 8 * row, row, layers)

    two = CopyJobs((commit(conv, 0, 1), commit(rec, 0, 1), commit(conv, 3, 5), commit(rec, 3, 5)))
    assert len(two.copies) == 4
    refused = {
        "the same slot twice": (commit(conv, 1, 1), commit(conv, 1, 2)),
        "one row of the slot's layer 2": (commit(rec, 2, 0), Zero2D(host, rec[2] + 2 * row, row, row, 1)),
        "another pitch, its second row": (commit(conv, 2, 0), Zero2D(host, rec[0] + 2 * row, 12 * row, 8, 2)),
        "a read of what it writes": (commit(conv, 0, 1), Copy2D(host, pool - row, row, conv[3] + 8, row, 8, 1)),
    }
    for what, copies in refused.items():
        with pytest.raises(ValueError, match="writes memory that copy"):
            CopyJobs(copies)
            pytest.fail(f"{what}: fused")
    CopyJobs((commit(conv, 2, 0), Zero2D(host, conv[1] + 3 * row, 16 * row, 8, 2)))  # another pitch, other rows

    rng = np.random.default_rng(0)
    for _ in range(2000):  # against every byte each touches: pitches negative, zero, below and above the width
        a, b = ((int(rng.integers(0, 200)), int(rng.integers(-40, 41)), int(rng.integers(1, 30)),
                 int(rng.integers(1, 7))) for _ in range(2))
        touched = [{start + r * pitch + k for r in range(height) for k in range(width)}
                   for start, pitch, width, height in (a, b)]
        try:
            CopyJobs((Zero2D(host, a[0], a[1], a[2], a[3]), Zero2D(host, b[0], b[1], b[2], b[3])))
            fused = True
        except ValueError:
            fused = False
        assert fused == touched[0].isdisjoint(touched[1]), (a, b)


@pytest.mark.parametrize("dims", [(32, 32, 32), (32, 64, 32)], ids=["one geometry", "per-layer head dims"])
def test_copy_pages_copies_each_pools_page_in_its_own_geometry(backend: Backend, dims: tuple[int, ...]) -> None:
    """Page ``dst`` of every pool ``[2, P, 128, 1, D]`` becomes page ``src``, K and V, whatever each pool's head dim
    (Gemma 4's full layers: 64 against the sliding ones' 32) and page count; nothing else changes."""
    s = Stream.create(backend)
    rng = np.random.default_rng(3)
    values = [rng.standard_normal((2, pages, 128, 1, d)).astype(np.float16) for d, pages in zip(dims, (6, 6, 5))]
    pools = [_device(backend, v, f"pool{i}", s) for i, v in enumerate(values)]
    copy_pages(pools, 6, [(1, 3), (0, 4)], s)
    for pool, want in zip(pools, values):
        want = want.copy()
        want[:, 3], want[:, 4] = want[:, 1], want[:, 0]
        np.testing.assert_array_equal(pool.to_numpy(s), want)


@pytest.mark.gpu
def test_a_launch_from_a_thread_without_a_context_leaves_the_thread_without_one(cuda) -> None:
    """A kernel launched from a thread that has no CUDA context current (a thread that only used the driver API)
    runs in the device's primary context, pushed for the launch and popped after: the thread's current context
    is what it was (none), not the device's left behind."""
    from cuda.bindings import driver

    from trtio._cuda import kernels

    src = Tensor.empty((64,), "uint8", backend=cuda)
    dst = Tensor.empty((64,), "uint8", backend=cuda)
    src.copy_from(np.arange(64, dtype=np.uint8))
    dst.zero_()
    stream = Stream.create(cuda)
    launch = kernels.copy_jobs(cuda.device_id, [(dst.data_ptr, 0, src.data_ptr, 0, 1, 64, 64, 64, 64, 64)], 64, 64)
    cuda.synchronize()
    seen: dict[str, Any] = {}

    def fresh_thread() -> None:
        seen["before"] = int(driver.cuCtxGetCurrent()[1])
        launch(stream.handle)
        seen["after"] = int(driver.cuCtxGetCurrent()[1])

    t = threading.Thread(target=fresh_thread)
    t.start()
    t.join()
    assert seen == {"before": 0, "after": 0}, "the launch left the thread's current context as it found it"
    assert dst.to_numpy(stream).tolist() == list(range(64)), "and the kernel ran"
    stream.close()


def test_own_graphs_run_the_work_at_its_first_launch_and_replay_it_after(backend: Backend) -> None:
    """A work launched through OwnGraphs (a hybrid slot's zeroing) runs at its first launch, where its graph is
    captured, and at every later one, which replays that graph; inside a caller's capture the work itself joins the
    caller's graph; equal works share one graph, and close destroys them."""
    from trtio._ops import AsGraph, OwnGraphs, Zero

    s = Stream.create(backend)
    t = _device(backend, np.full(64, 7, np.uint8), "rows", s)
    graphs = OwnGraphs(backend, "test graphs")
    try:
        work = AsGraph(Zero(t, 32), graphs, id(graphs))
        want = np.full(64, 7, np.uint8)
        want[:32] = 0
        for _ in range(2):
            t.copy_from(np.full(64, 7, np.uint8), s)
            work.enqueue(s)
            np.testing.assert_array_equal(t.to_numpy(s), want)
        assert len(graphs) == 1
        AsGraph(Zero(t, 32), graphs, id(graphs)).enqueue(s)  # an equal work: its graph
        assert len(graphs) == 1
        t.copy_from(np.full(64, 7, np.uint8), s)
        backend.begin_capture(s.handle)
        try:
            AsGraph(Zero(t, 16), graphs, id(graphs)).enqueue(s)
        finally:
            outer = backend.end_capture(s.handle)
        assert len(graphs) == 1, "inside a capture the work joins the caller's graph"
        backend.launch_graph(outer, s.handle)
        backend.destroy_graph(outer)
        want[16:32] = 7
        np.testing.assert_array_equal(t.to_numpy(s), want)
    finally:
        graphs.close()
        assert len(graphs) == 0
        t.close()
        s.close()
