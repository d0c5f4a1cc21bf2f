import numpy as np
import pytest
from _configs import llm_config
from _host_kernels import host_kernels_and_cuda  # noqa: F401  (the module's backend fixture)

import trtio
from trtio import BindingError, names
from trtio._engine import EngineIO, TensorInfo
from trtio._state import EngineState
from trtio._tensor_map import TensorMap
from trtio.testing import ReferenceEngine


def _state(cfg=None, **kw):
    eio = EngineIO.from_engine(ReferenceEngine.from_config(cfg or llm_config(**kw), device="host", null_compute=True))
    return eio, EngineState(eio, max_batch=4, backend="host")


def test_pairs_at_profile_max_bound_under_both_names(host):
    eio, st = _state(kv_cache_dtype="bfloat16")
    assert len(st.pairs) == 4
    t = st.tensors[names.k_cache(1)]
    assert t.shape == (4, 2, 128, 16) and str(t.dtype) == "bfloat16"
    tm = TensorMap("m")
    st.bind(tm)
    assert tm[names.k_cache(1)] is tm[names.present_k_cache(1)] is t
    assert tm[names.kKVCacheStartIndex] is st.kv_lengths
    assert st.stable_names() == {n for pair in st.pairs for n in pair}
    st.close()


def test_bound_shape_follows_the_step_batch():
    _, st = _state()
    assert st.shape_for(names.v_cache(0), 2) == (2, 2, 128, 16)
    assert st.shapes(3)[names.present_v_cache(0)] == (3, 2, 128, 16)
    st.close()


def test_start_index_views_and_reset():
    _, st = _state()
    assert st.upload_start_index(None).shape == (0,), "an empty-cache prefill binds [0]"
    dev = st.upload_start_index(np.array([3, 5]))
    assert dev.shape == (2,) and dev.to_numpy().tolist() == [3, 5]
    st.lengths[:2] = [3, 5]
    st.reset(clear=True)
    assert not st.lengths.any()
    assert not st.tensors[names.k_cache(0)].view("uint8").to_numpy().any()
    st.close()


def test_memory_report_and_close_free_everything(host):
    live = host.live_allocations
    _, st = _state()
    rep = st.memory_report()
    assert rep.entry(names.k_cache(0)).nbytes == 4 * 2 * 128 * 16 * 2
    assert st.nbytes == 4 * rep.entry(names.k_cache(0)).nbytes
    st.close()
    st.close()
    assert host.live_allocations == live


def test_unbounded_state_is_refused():
    eio, st = _state()
    st.close()
    info = eio[names.k_cache(0)]
    unbounded = TensorInfo(info.index, info.name, info.mode, info.dtype, info.shape, info.location, False,
                           tuple((lo, opt, (-1,) + hi[1:]) for lo, opt, hi in info.profiles), None)
    tensors = tuple(unbounded if t.name == info.name else t for t in eio.tensors)
    broken = EngineIO(eio.name, tensors, eio.num_profiles)
    with pytest.raises(BindingError, match=r"k_cache_0: state input has no bounded max shape"):
        EngineState(broken, max_batch=4, backend="host")


def test_state_owns_its_specs_and_derives_them_from_the_engine():
    cfg = llm_config()
    dyn = EngineState(EngineIO.from_engine(ReferenceEngine.from_config(cfg, device="host", null_compute=True)), cfg,
                      max_batch=4, backend="host")
    fixed_eio = EngineIO.from_engine(ReferenceEngine.from_config(cfg, device="host", null_compute=True,
                                                                 fixed_cache_batch=True))
    fixed = EngineState(fixed_eio, cfg, max_batch=4, backend="host")
    assert {s.name: s.shape for s in dyn.specs()}[names.k_cache(0)] == ("batch", 2, 128, 16)
    assert {s.name: s.shape for s in fixed.specs()}[names.present_v_cache(1)] == (4, 2, 128, 16)
    assert fixed.shape_for(names.k_cache(0), 2) == (4, 2, 128, 16), "a fixed batch dim stays fixed"
    assert dyn.shape_for(names.k_cache(0), 2) == (2, 2, 128, 16), "a dynamic one follows the step"
    assert {s.name for s in dyn.specs()} == {n for pair in dyn.pairs for n in pair} | {names.kKVCacheStartIndex}
    dyn.close()
    fixed.close()


def test_a_fixed_cache_batch_smaller_than_the_setup_is_refused():
    cfg = llm_config()
    eio = EngineIO.from_engine(ReferenceEngine.from_config(cfg, device="host", null_compute=True,
                                                           fixed_cache_batch=True))
    with pytest.raises(BindingError, match=r"k_cache_0: the engine fixes the cache batch to 4, smaller than the "
                                           r"8 sequences"):
        EngineState(eio, cfg, max_batch=8, backend="host")


def test_missing_present_output_is_refused_at_create_time():
    class NoPresent(ReferenceEngine):
        __module__ = ReferenceEngine.__module__

        def get_aliased_input_tensor(self, name):
            return None if name == names.present_k_cache(0) else super().get_aliased_input_tensor(name)

        def get_tensor_name(self, index):
            name = super().get_tensor_name(index)
            return "unrelated_output" if name == names.present_k_cache(0) else name

    cfg = llm_config()
    eio = EngineIO.from_engine(NoPresent.from_config(cfg, device="host", null_compute=True))
    with pytest.raises(BindingError) as info:
        EngineState(eio, cfg, max_batch=4, backend="host")
    assert "k_cache_0: the engine declares this state input but no output updates it in place " \
           "(expected present_k_cache_0)" in str(info.value)


# -- committing accepted paths: one device operation, bit-identical to per-slot copies ---------------------


def _random_paths(rng: np.random.Generator, batch: int, nodes: int, longest: int) -> list[list[int]]:
    paths = []
    for _ in range(batch):
        depth = int(rng.integers(1, longest + 1))
        rest = sorted(rng.choice(np.arange(1, nodes), size=depth - 1, replace=False).tolist())
        paths.append([0] + rest)
    return paths


def _per_slot_reference(caches: dict[str, np.ndarray], paths, starts, *, paged: bool, table=None, page=0):
    """The accepted paths applied one slot at a time, in order (what trtio did before: one copy per layer,
    K/V, sequence and moved node)."""
    out = {n: a.copy() for n, a in caches.items()}
    for b, (start, path) in enumerate(zip(starts, paths)):
        for j, node in enumerate(path):
            if node == j:
                continue
            src, dst = start + node, start + j
            for arr in out.values():
                if paged:
                    for half in (0, 1):
                        ps, pd = table[b, half, src // page], table[b, half, dst // page]
                        flat = arr.reshape(-1, page, *arr.shape[3:])
                        flat[pd, dst % page] = flat[ps, src % page]
                else:
                    arr[b, :, dst] = arr[b, :, src]
    return out


@pytest.mark.parametrize("kv", ["float16", "fp8"])
@pytest.mark.parametrize("layout", ["contiguous", "paged"])
@pytest.mark.parametrize("head_dim", [16, 6])  # 6: entry pieces that are no whole number of 16-byte words
def test_commit_paths_is_bit_identical_to_per_slot_copies(backend, layout: str, kv: str, head_dim: int) -> None:
    import dataclasses

    from trtio.testing.toy_engines import default_engines_dir

    rng = np.random.default_rng(7)
    dims = {} if head_dim == 16 else dict(head_dim=head_dim, rotary_dim=head_dim)
    if layout == "paged":
        cfg = trtio.EngineDir.open(default_engines_dir() / "toy-llm-ragged").config
        cfg = dataclasses.replace(cfg, kv_cache_dtype=kv, num_attention_layers=3, kv_pool_pages=0, **dims).validate()
    else:
        cfg = llm_config(kv_cache_dtype=kv, num_attention_layers=3, max_kv_cache_capacity=256, **dims)
    eio = EngineIO.from_engine(ReferenceEngine.from_config(cfg, device="host", null_compute=True))
    s = trtio.Stream.create(backend)
    st = EngineState(eio, cfg, s, max_batch=4, backend=backend)  # its tables uploaded on the test's stream too
    try:
        caches = {}
        for name in st._kv_caches:
            t = st.tensors[name].view(trtio.DType.UINT8)
            raw = rng.integers(0, 256, t.shape, dtype=np.uint8)
            t.copy_from(raw, s)
            caches[name] = raw.view(np.uint8).reshape(st.tensors[name].shape + (-1,))
        table = None
        if layout == "paged":  # scatter each sequence's pages over the pool
            m, pool = st.pages_per_sequence, st.pool_pages
            k_ids = rng.permutation(pool)[: 4 * m].reshape(4, m)
            table = np.stack([k_ids, k_ids + pool], axis=1).astype(np.int32)
            st.page_table.copy_from(table, s)
        for rnd in range(3):
            paths = _random_paths(rng, 4, 60, 6)
            starts = rng.integers(0, 120, size=4)
            want = _per_slot_reference(caches, paths, starts, paged=layout == "paged", table=table,
                                       page=cfg.kv_page_size)
            st.commit_paths(starts, paths, s)
            got = {n: st.tensors[n].view(trtio.DType.UINT8).to_numpy(s).reshape(want[n].shape) for n in caches}
            for n in caches:
                np.testing.assert_array_equal(got[n], want[n], err_msg=f"{n}, round {rnd}")
            assert any(not np.array_equal(want[n], caches[n]) for n in caches), "the paths moved something"
            caches = want
    finally:
        st.close()
        s.close()


def test_commit_paths_is_one_device_operation_after_one_staged_copy(host) -> None:
    cfg = llm_config(num_attention_layers=6)
    st = EngineState(EngineIO.from_engine(ReferenceEngine.from_config(cfg, device="host", null_compute=True)), cfg,
                     max_batch=4, backend="host")
    ops = host.op_count
    st.commit_paths([3, 5, 0, 9], [[0, 2, 5, 7], [0, 1], [0, 4], [0, 3, 6]])
    assert host.op_count - ops == 2, "one upload of the moves and one op over every layer, K and V"
    with pytest.raises(trtio.ShapeError, match=r"paths\[0\]: 33 moved entries, more than the 32"):
        st.commit_paths([0], [list(range(0, 67, 2))])
    st.close()


def test_short_paths_in_a_grid_wider_than_a_path_may_be_commit_as_those_paths(host) -> None:
    """An int array of paths padded with -1 past the longest path a commit may move: the padding is
    dropped, and the caches end as with the paths given as lists."""
    cfg = llm_config(num_attention_layers=2)
    eio = EngineIO.from_engine(ReferenceEngine.from_config(cfg, device="host", null_compute=True))
    states = [EngineState(eio, cfg, max_batch=2, backend="host") for _ in range(2)]
    try:
        rng = np.random.default_rng(5)
        for name in states[0]._kv_caches:
            raw = rng.integers(0, 256, states[0].tensors[name].view(trtio.DType.UINT8).shape, dtype=np.uint8)
            for st in states:
                st.tensors[name].view(trtio.DType.UINT8).copy_from(raw)
        wide = np.full((2, 40), -1)
        wide[0, :3], wide[1, :2] = [0, 2, 5], [0, 1]
        states[0].commit_paths([4, 9], wide)
        states[1].commit_paths([4, 9], [[0, 2, 5], [0, 1]])
        for name in states[0]._kv_caches:
            got, want = (st.tensors[name].view(trtio.DType.UINT8).to_numpy() for st in states)
            np.testing.assert_array_equal(got, want, err_msg=name)
    finally:
        for st in states:
            st.close()


def test_a_commit_over_unevenly_spaced_caches_moves_what_per_slot_copies_move(backend) -> None:
    """Caches that are not one arena's evenly spaced tensors (here three allocated apart, a spacer between
    two of them): the commit still equals per-slot copies, in every cache."""
    from trtio._ops import KVCommit, KVLayout

    rng = np.random.default_rng(3)
    b, heads, dim = 3, 2, 8
    cap = 32
    with trtio.Stream.create(backend) as s:
        caches, spacers = [], []
        for i in range(3):
            caches.append(trtio.Tensor.empty((b, heads, cap, dim), "float16", trtio.Location.DEVICE,
                                             backend=backend, name=f"cache{i}"))
            spacers.append(trtio.Tensor.empty((1000 * (i + 1),), "uint8", trtio.Location.DEVICE, backend=backend,
                                              name=f"spacer{i}"))
        table = trtio.Tensor.empty((len(caches),), "int64", trtio.Location.DEVICE, backend=backend, name="table")
        moves = trtio.Tensor.empty((b, 7), "int32", trtio.Location.DEVICE, backend=backend, name="moves")
        try:
            table.copy_from(np.array([t.data_ptr for t in caches], np.int64), s)
            values = [rng.standard_normal(t.shape).astype(np.float16) for t in caches]
            for t, v in zip(caches, values):
                t.copy_from(v, s)
            commit = KVCommit(caches, table, KVLayout(paged=False, heads=heads, capacity=cap, entry_bytes=2 * dim))
            assert commit.stride == 0, "the caches were meant to be unevenly spaced"
            paths, starts = [[0, 2, 5, 6], [0, 1], [0, 3]], [4, 10, 0]
            rows = np.zeros((b, 6), np.int32)  # [start, path length, the path's nodes]
            for i, (path, start) in enumerate(zip(paths, starts)):
                rows[i, :2 + len(path)] = [start, len(path), *path]
            moves.reshape((b, 6)).copy_from(rows, s)
            commit.run(moves, b, 6, s)
            for t, v in zip(caches, values):
                want = v.copy()
                for i, (path, start) in enumerate(zip(paths, starts)):
                    for j, node in enumerate(path):
                        want[i, :, start + j] = want[i, :, start + node]
                np.testing.assert_array_equal(t.to_numpy(s), want, err_msg=t.name)
        finally:
            for t in (*caches, *spacers, table, moves):
                t.close()
