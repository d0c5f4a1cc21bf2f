import json

import numpy as np
import pytest

import trtio
from trtio import Arena, ClosedError, Location, MemoryReport, TensorRequest, TrtioError
from trtio.cuda.host import HostBackend


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
    with pytest.raises(ClosedError):
        t.data_ptr
    with pytest.raises(ClosedError):
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
    with pytest.raises(trtio.CapacityError):
        x.reshape((5, 8))
    arena.close()
