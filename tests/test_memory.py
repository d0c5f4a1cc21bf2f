import json

import numpy as np
import pytest

import trtio
from trtio import ClosedError, Location, TrtioError
from trtio._cuda.host import HostBackend
from trtio._memory import Arena, MemoryReport, TensorRequest
from trtio.errors import InvalidValueError


def _requests():
    return [
        TensorRequest.of("a", (3, 5), "float16"),
        TensorRequest.of("b", (0, 8), "float16"),
        TensorRequest.of("c", (7,), "int64"),
        TensorRequest.of("d", (4,), "int32", Location.PINNED),
    ]


def test_one_allocation_per_location_and_aligned_slices(backend):
    before = backend.alloc_count
    arena = Arena(_requests(), backend=backend, title="t")
    assert backend.alloc_count - before == 2  # device + pinned
    assert arena.allocation_count == 2
    a, b, c, d = (arena[n] for n in "abcd")
    for t in (a, c, d):
        assert t.data_ptr % 256 == 0
    assert b.data_ptr == 0 and b.is_empty
    assert c.data_ptr - a.data_ptr == 256
    assert arena.block_size(Location.DEVICE) == 512
    arena.close()


def test_slices_do_not_overlap_and_hold_their_data(backend):
    arena = Arena(_requests(), backend=backend)
    arena["a"].fill_(1.0)
    arena["c"].fill_(-9)
    arena["d"].fill_(5)
    assert (arena["a"].to_numpy() == 1.0).all()
    assert (arena["c"].to_numpy() == -9).all()
    assert (arena["d"].to_numpy() == 5).all()
    arena.close()


def test_report_totals_ratio_and_json(host):
    arena = Arena(_requests(), backend=host, title="plan")
    rep = arena.report()
    assert rep.total_required == 30 + 56 + 16
    assert rep.allocated == {"device": 512, "pinned": 256}
    assert rep.alignment_waste == 768 - 102
    assert rep.ratio == pytest.approx(768 / 102)
    data = json.loads(rep.to_json())
    assert data["entries"][2]["name"] == "c" and data["entries"][2]["nbytes"] == 56
    assert data["entries"][2]["offset"] == 256
    text = str(rep)
    assert "plan" in text and "ratio" in text and "7" in text
    both = MemoryReport.combine("all", [rep, rep])
    assert both.total_required == 2 * rep.total_required and both.entries[0].group == "plan"
    arena.close()


def test_close_frees_everything_and_slices_become_unusable(host):
    live = host.live_allocations
    arena = Arena(_requests(), backend=host)
    t = arena["a"]
    arena.close()
    arena.close()
    assert host.live_allocations == live
    with pytest.raises(ClosedError, match="^tensor 'a' is closed$"):
        t.data_ptr
    with pytest.raises(ClosedError, match="^arena 'arena' is closed$"):
        arena["a"]


def test_duplicate_names_refused():
    with pytest.raises(TrtioError, match=r"repeated: \['x'\]"):
        Arena([TensorRequest.of("x", (1,), "int32"), TensorRequest.of("x", (2,), "int32")],
              backend="host")


class FailingBackend(HostBackend):
    """Fails its n-th allocation, like a pinned allocation failing after the device one."""

    def __init__(self, fail_at):
        super().__init__()
        self.fail_at = fail_at

    def alloc(self, nbytes, location):
        if self.alloc_count + 1 == self.fail_at:
            raise trtio.CudaError("cudaMallocHost", "cudaErrorMemoryAllocation")
        return super().alloc(nbytes, location)


def test_failed_allocation_leaves_nothing_half_allocated():
    be = FailingBackend(fail_at=2)
    with pytest.raises(trtio.CudaError, match="cudaMallocHost"):
        Arena(_requests(), backend=be)
    assert be.live_allocations == 0


def test_arena_tensors_reshape_within_their_slice(host):
    arena = Arena([TensorRequest.of("x", (4, 8), "float32")], backend=host)
    x = arena["x"]
    x.reshape((2, 8)).copy_from(np.ones((2, 8), np.float32))
    with pytest.raises(trtio.CapacityError, match=r"tensor 'x': shape \(5, 8\) of float32 needs 160 bytes but the "
                                                 r"capacity is 128 bytes"):
        x.reshape((5, 8))
    arena.close()


@pytest.mark.parametrize("shape,needle", [((2, -1), "negative dimension -1"), ((2, 1.5), "non-integer"),
                                          (None, "sequence")])
def test_tensor_requests_validate_their_shape_naming_the_tensor(shape, needle):
    with pytest.raises(trtio.ShapeError, match=rf"shape of tensor 'kv'.*{needle}"):
        TensorRequest("kv", shape, trtio.DType.INT32)


def test_tensor_requests_validate_dtype_and_location():
    with pytest.raises(InvalidValueError, match=r"location of tensor 'kv': 'gpu' is not a memory location"):
        TensorRequest("kv", (2,), trtio.DType.INT32, "gpu")
    with pytest.raises(InvalidValueError, match=r"dtype of tensor 'kv'.*'int3'"):
        TensorRequest.of("kv", (2,), "int3")
    r = TensorRequest("kv", [np.int64(2), 3], "int32", "pinned")
    assert (r.shape, r.dtype, r.location) == ((2, 3), trtio.DType.INT32, Location.PINNED)
    assert all(type(d) is int for d in r.shape)


def test_an_arena_too_big_to_allocate_names_itself_and_the_bytes(host):
    live = host.live_allocations
    with pytest.raises(trtio.CudaError, match=r"cudaMallocHost: cudaErrorMemoryAllocation: arena 'big': a pinned "
                                              r"block of 8796093022208 bytes for 1 tensor\(s\) asked"):
        Arena([TensorRequest.of("small", (4,), "int32"),
               TensorRequest.of("huge", (2**41,), "float32", Location.PINNED)], backend=host, title="big")
    assert host.live_allocations == live, "the device block made before is freed"


@pytest.mark.parametrize("alignment", [0, -256, 100, True])
def test_arena_alignment_must_be_a_multiple_of_256(host, alignment):
    with pytest.raises(InvalidValueError, match="alignment"):
        Arena(_requests(), backend=host, alignment=alignment)


def test_arena_takes_tensor_requests_only(host):
    with pytest.raises(TypeError, match="request 1 is a tuple"):
        Arena([TensorRequest.of("a", (1,), "int32"), ("b", (1,), "int32")], backend=host)


def test_arena_names_a_missing_tensor(host):
    arena = Arena(_requests(), backend=host, title="plan")
    with pytest.raises(KeyError, match=r"arena 'plan' has no tensor 'z'"):
        arena["z"]
    arena.close()


