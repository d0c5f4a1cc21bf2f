"""Staging: the one upload ring (its fencing rule, what it keeps alive); StepStaging: one host write and one copy
per step; constants the device block holds are not sent again."""

import gc
import weakref

import numpy as np
import pytest

from trtio._contracts.ragged import (
    PHASE_DECODE,
    PHASE_DRAFT,
    PHASE_VERIFY,
    TreeLayout,
    causal_step,
    decode_step,
    pack_rows,
    packed_tree_step,
    tree_step,
)
from trtio._cuda.backend import Location
from trtio._cuda.host import HostBackend
from trtio._memory import Arena, TensorRequest
from trtio._staging import INPUT_RING_SLOTS, StepStaging, UploadRing, constant
from trtio._stream import Stream
from trtio.errors import CapacityError, ClosedError, InvalidValueError, TrtioError


def _block(backend):
    reqs = StepStaging.requests([TensorRequest("a", (8,), "int32"), TensorRequest("b", (8,), "int32"),
                                 TensorRequest("c", (4,), "int64")])
    arena = Arena(reqs, backend=backend, title="block")
    return arena, StepStaging(arena, ["a", "b", "c"], title="block")


def test_one_copy_moves_every_value_written(host):
    arena, step = _block(host)
    s = Stream.create(host)
    ops = host.op_count
    step.write("a", np.arange(3, dtype=np.int32))
    step.write("c", np.array([7, 8], np.int64))
    step.upload(s)
    assert host.op_count - ops == 1, "one copy for the whole block"
    s.synchronize()
    assert step.tensors["a"].reshape((3,)).to_numpy().tolist() == [0, 1, 2]
    assert step.tensors["c"].reshape((2,)).to_numpy().tolist() == [7, 8]
    step.close()
    arena.close()
    s.close()


def test_a_constant_the_device_holds_is_not_written_again(host):
    arena, step = _block(host)
    s = Stream.create(host)
    ones = constant(np.ones(4, np.int32))
    step.write("a", ones)
    step.upload(s)
    step.write("a", ones)
    assert step.skipped == 1
    ops = host.op_count
    step.upload(s)
    assert host.op_count == ops, "nothing new was written: no copy"
    # An equal array that is not the same constant is written (its content is not compared).
    step.write("a", np.ones(4, np.int32))
    assert step.skipped == 1
    # Another value for the name makes the device forget the constant: writing it again sends it again.
    step.write("a", np.full(4, 5, np.int32))
    step.upload(s)
    step.write("a", ones)
    step.upload(s)
    s.synchronize()
    assert step.skipped == 1
    assert step.tensors["a"].reshape((4,)).to_numpy().tolist() == [1, 1, 1, 1]
    step.close()
    arena.close()
    s.close()


def test_a_constant_written_but_never_uploaded_is_written_again(host):
    arena, step = _block(host)
    s = Stream.create(host)
    twos = constant(np.full(3, 2, np.int32))
    step.write("b", twos)  # a step that failed before its upload
    step.write("b", twos)
    assert step.skipped == 0
    step.upload(s)
    s.synchronize()
    assert step.tensors["b"].reshape((3,)).to_numpy().tolist() == [2, 2, 2]
    step.close()
    arena.close()
    s.close()


def test_writable_or_borrowed_arrays_are_never_skipped(host):
    arena, step = _block(host)
    s = Stream.create(host)
    buf = np.zeros(4, np.int32)
    ro_view = np.broadcast_to(buf, (4,))  # read-only, but a view of a buffer that may change
    for values in (buf, ro_view):
        step.write("a", values)
        step.upload(s)
        buf[:] += 1
        step.write("a", values)
        step.upload(s)
        s.synchronize()
        assert step.tensors["a"].reshape((4,)).to_numpy().tolist() == buf.tolist()
    assert step.skipped == 0
    step.close()
    arena.close()
    s.close()


def test_write_all_writes_as_write_does_value_by_value(host):
    """write_all is write of each value in one call: a held constant is skipped, another value for its name (or
    for the elements a write_at constant holds) makes the block forget it, and a value that does not fit raises
    with the values before it still going with the next upload."""
    arena, step = _block(host)
    s = Stream.create(host)
    ones, sevens = constant(np.ones(4, np.int32)), constant(np.full(2, 7, np.int64))
    step.write_all(("a", "c"), (ones, sevens))
    ops = host.op_count
    step.upload(s)
    assert host.op_count - ops == 1, "one copy for the whole block"
    step.write_all(("a", "c"), (ones, sevens))
    assert step.skipped == 2
    step.write_all(("a", "c"), (np.full(4, 5, np.int32), sevens))  # a plain array for "a": the block forgets `ones`
    step.upload(s)
    step.write_all(("a",), (ones,))  # written again
    step.upload(s)
    s.synchronize()
    assert step.skipped == 3
    assert step.tensors["a"].reshape((4,)).to_numpy().tolist() == [1, 1, 1, 1]
    placed = constant(np.array([8, 9], np.int32))
    step.write_at("b", 2, placed)
    step.upload(s)
    step.write_all(("b",), (np.zeros(4, np.int32),))  # over it
    step.upload(s)
    step.write_at("b", 2, placed)  # written again
    step.upload(s)
    s.synchronize()
    assert step.skipped == 3
    assert step.tensors["b"].reshape((4,)).to_numpy().tolist() == [0, 0, 8, 9]
    with pytest.raises(CapacityError, match=r"'c' holds 4 values, a step asked for 5"):
        step.write_all(("a", "c"), (np.full(2, 3, np.int32), np.zeros(5, np.int64)))
    step.upload(s)  # the value written before the one that did not fit goes with it
    s.synchronize()
    assert step.tensors["a"].reshape((2,)).to_numpy().tolist() == [3, 3]
    step.close()
    arena.close()
    s.close()


def test_constants_written_at_their_own_elements_stay_in_the_block(host):
    """write_at puts each constant in elements of its own: a step that writes the same constants at the same
    places again makes no copy; a value written over part of one makes the block forget that one (and only
    that one), and a whole-name write forgets them all."""
    arena, step = _block(host)
    s = Stream.create(host)
    first, second = constant(np.array([1, 2, 3], np.int32)), constant(np.array([4, 5], np.int32))
    step.write_at("a", 0, first)
    step.write_at("a", 4, second)
    step.upload(s)
    ops = host.op_count
    step.write_at("a", 0, first)
    step.write_at("a", 4, second)
    step.upload(s)
    assert (step.skipped, host.op_count - ops) == (2, 0), "both held: nothing written, no copy"
    step.write_at("a", 2, constant(np.array([9], np.int32)))  # over the last element of `first`
    step.upload(s)
    step.write_at("a", 0, first)  # written again: the block no longer holds it
    step.write_at("a", 4, second)  # untouched: still held
    assert step.skipped == 3
    step.upload(s)
    s.synchronize()
    got = step.tensors["a"].reshape((8,)).to_numpy()
    assert got[:3].tolist() == [1, 2, 3] and got[4:6].tolist() == [4, 5]
    step.write("a", np.zeros(8, np.int32))
    step.upload(s)
    step.write_at("a", 4, second)
    assert step.skipped == 3, "the whole-name write overwrote it"
    step.upload(s)
    s.synchronize()
    assert step.tensors["a"].reshape((8,)).to_numpy().tolist() == [0, 0, 0, 0, 4, 5, 0, 0]
    step.close()
    arena.close()
    s.close()


def test_write_at_refuses_values_past_the_end_of_the_name(host):
    arena, step = _block(host)
    with pytest.raises(CapacityError, match=r"'a' holds 8 values, a step asked for 3 \(\(3,\)\) from element 6"):
        step.write_at("a", 6, np.zeros(3, np.int32))
    with pytest.raises(CapacityError, match="'a' holds 8 values"):
        step.write_at("a", -1, np.zeros(1, np.int32))
    assert not step.pending, "nothing was written"
    step.close()
    arena.close()


def test_constant_is_a_read_only_copy():
    src = np.arange(3)
    c = constant(src)
    src[0] = 9
    assert c.tolist() == [0, 1, 2] and not c.flags.writeable and c.flags.owndata
    with pytest.raises(ValueError):
        c[0] = 1


def _fields(layout):
    return {k: v for k, v in vars(layout).items() if isinstance(v, np.ndarray)}


def _same(a, b):
    fa, fb = _fields(a), _fields(b)
    assert fa.keys() == fb.keys() and (a.width, a.phase) == (b.width, b.phase)
    for k in fa:
        assert fa[k].dtype == fb[k].dtype, k
        assert fa[k].tolist() == fb[k].tolist(), k


@pytest.mark.parametrize("past", [[0], [5, 0, 17], [3, 3, 3, 3, 3, 3, 3, 3]])
def test_decode_step_is_causal_step_of_one_token(past):
    past = np.array(past, np.int64)
    ref = causal_step(past, np.ones(past.size, np.int64), 1, phase=PHASE_DECODE)
    got = decode_step(past)
    _same(got, ref)
    again = decode_step(past + 1)
    for name in ("query_start_offsets", "query_lengths", "state_indices", "logits_indices"):
        assert getattr(again, name) is getattr(got, name), f"{name} is shared between steps"


@pytest.mark.parametrize("width", [1, 4, 33])
def test_chains_are_laid_out_as_their_causal_masks_are(width):
    """TreeLayout.chains (a catch-up's accept lengths, from rows made once per width) equals TreeLayout.of of the
    chains' causal masks, field by field, for chains of every length from 1 to the width (two mask words past 32
    rows); two layouts of one shape share their depth, parent and depth rows, which every chain has."""
    rng = np.random.default_rng(width)
    j = np.arange(width)
    for _ in range(5):
        lengths = rng.integers(1, width + 1, 6)
        take = j[None, :] < lengths[:, None]
        causal = take[:, :, None] & take[:, None, :] & (j[None, :, None] >= j[None, None, :])
        rows = np.arange(6) * width + lengths - 1
        phase = PHASE_DRAFT if width > 1 else PHASE_DECODE
        want = TreeLayout.of(pack_rows(causal, width), np.broadcast_to(j, take.shape), take, phase=phase,
                             logits_rows=rows)
        got = TreeLayout.chains(lengths, width, phase=phase, logits_rows=rows)
        _same(got, want)
        assert all(not v.flags.writeable and v.flags.owndata for v in _fields(got).values()), "constants"
    again = TreeLayout.chains(np.ones(6, np.int64), width, phase=phase, logits_rows=np.arange(6) * width)
    assert again.tree_parent_ids is got.tree_parent_ids and again.tree_depths is got.tree_depths


def _random_tree(rng, s, n, width):
    parents = np.full((s, n), -1)
    for b in range(s):
        for t in range(1, n):
            parents[b, t] = rng.integers(0, t)
    vis = np.zeros((s, n, n), bool)
    for b in range(s):
        for t in range(n):
            a = t
            while a >= 0:
                vis[b, t, a] = True
                a = parents[b, a]
    return vis, parents


@pytest.mark.parametrize("seed", range(5))
def test_tree_layout_at_equals_a_fresh_tree_step(seed):
    rng = np.random.default_rng(seed)
    s, n = int(rng.integers(1, 5)), int(rng.integers(1, 40))
    vis, parents = _random_tree(rng, s, n, n)
    real = vis.any(axis=2)
    depth = vis.sum(axis=2) - 1
    rows = np.arange(s * n)
    tpl = TreeLayout.of(pack_rows(vis, n), depth, real, phase=PHASE_VERIFY, logits_rows=rows, parents=parents)
    for _ in range(3):
        past = rng.integers(0, 100, s)
        _same(tpl.at(past), tree_step(past, vis, n, phase=PHASE_VERIFY, logits_rows=rows, parents=parents))
    chain = TreeLayout.of(pack_rows(vis, n), depth, real, phase=PHASE_DRAFT, logits_rows=rows, padding_position=0)
    past = rng.integers(0, 100, s)
    _same(chain.at(past), packed_tree_step(past, pack_rows(vis, n), depth, real, phase=PHASE_DRAFT,
                                           logits_rows=rows, padding_position=0))
    assert tpl.at(past).packed_mask is tpl.packed_mask, "a kept tree's mask is one shared constant"


def test_uploads_wait_only_when_the_host_is_a_ring_ahead_of_the_device() -> None:
    """Each upload copies from its own ring slot: while the device has run none of them (every fence
    pending), RING_SLOTS uploads go without a wait, the next one waits for the oldest slot's copy. The
    values of every upload reach the device block (the slots never mix)."""
    from trtio._cuda.host import HostBackend
    from trtio._staging import RING_SLOTS

    class Behind(HostBackend):
        """A device that has finished nothing yet, until the host waits for it."""

        def __init__(self) -> None:
            super().__init__()
            self.waits = 0

        def query_event(self, event: int) -> bool:
            return False

        def synchronize_event(self, event: int) -> None:
            self.waits += 1
            super().synchronize_event(event)

    be = Behind()
    arena, step = _block(be)
    s = Stream.create(be)
    for i in range(RING_SLOTS):
        step.write("a", np.full(3, i, np.int32))
        step.upload(s)
    assert be.waits == 0 and step.fence_waits == 0
    step.write("a", np.full(3, 99, np.int32))
    step.upload(s)
    assert be.waits == 1 and step.fence_waits == 1, "the ninth upload reuses the first slot: it waits"
    s.synchronize()
    assert step.tensors["a"].reshape((3,)).to_numpy().tolist() == [99, 99, 99]
    step.close()
    arena.close()
    s.close()


def test_a_ring_of_inputs_in_flight_fences_a_quarter_of_its_slots_at_once() -> None:
    """A setup's ring of inputs in flight (HOLD_SLOTS slots, no memory: every call that copies an input it does not
    own takes one) records one event per quarter of its slots, not per FENCE_EVERY uses: a call pays an event's
    record and question a sixteenth of the time. What a use keeps is let go once its slot comes round again."""
    import weakref

    from trtio._cuda.host import HostBackend
    from trtio._staging import FENCE_EVERY, HOLD_SLOTS, UploadRing

    class Counting(HostBackend):
        def __init__(self) -> None:
            super().__init__()
            self.records = 0

        def record_event(self, event: int, stream: int) -> None:
            super().record_event(event, stream)
            self.records += 1

    class Input:
        pass

    be = Counting()
    s = Stream.create(be)
    group = HOLD_SLOTS // 4
    assert group > FENCE_EVERY
    uses = 3 * HOLD_SLOTS
    with UploadRing(None, be, slots=HOLD_SLOTS) as ring:
        first = Input()
        gone = weakref.ref(first)
        ring.put(ring.take(), s, (first,), fence=False)
        del first
        for _ in range(uses - 1):
            ring.put(ring.take(), s, (Input(),), fence=False)
        assert be.records == (uses - 1) // group, "one event per group of uses (a take fences a full group)"
        assert gone() is None, "the first use's input, let go when its slot was taken again"
    s.close()


def test_one_fence_covers_a_group_of_uploads_on_its_stream() -> None:
    """An event is recorded after every FENCE_EVERY uploads on a stream, and on the old stream when an
    upload comes on another: each recorded on the stream of the copies it covers. Reusing a slot asks
    its group's event once; the group's other slots are then known free."""
    from trtio._cuda.host import HostBackend
    from trtio._staging import FENCE_EVERY, RING_SLOTS

    class Counting(HostBackend):
        def __init__(self) -> None:
            super().__init__()
            self.records: list[int] = []
            self.queries = 0

        def record_event(self, event: int, stream: int) -> None:
            super().record_event(event, stream)
            self.records.append(stream)

        def query_event(self, event: int) -> bool:
            self.queries += 1
            return super().query_event(event)

    be = Counting()
    arena, step = _block(be)
    s1, s2 = Stream.create(be), Stream.create(be)

    def upload(s: Stream, value: int) -> None:
        step.write("a", np.full(3, value, np.int32))
        step.upload(s)

    for i in range(RING_SLOTS):
        upload(s1, i)
    assert be.records == [s1.handle] * (RING_SLOTS // FENCE_EVERY) and be.queries == 0
    for i in range(FENCE_EVERY):  # the first group's slots, reused: one question for all of them
        upload(s1, i)
    assert be.queries == 1 and len(be.records) == RING_SLOTS // FENCE_EVERY + 1
    upload(s2, 50)  # a new group on s2, open
    assert len(be.records) == RING_SLOTS // FENCE_EVERY + 1
    upload(s1, 51)  # back to s1: s2's copy is fenced on s2 first
    assert be.records[-1] == s2.handle
    s1.synchronize()
    assert step.tensors["a"].reshape((3,)).to_numpy().tolist() == [51, 51, 51]
    step.close()
    arena.close()
    s1.close()
    s2.close()


def test_uploads_on_a_stream_closed_since_are_waited_for_not_fenced_there(host) -> None:
    """The open group's stream is closed before the next upload comes on another stream: no event can be
    recorded on it, so the upload waits for the device (once) and carries on."""
    arena, step = _block(host)
    s1, s2 = Stream.create(host), Stream.create(host)
    step.write("a", np.full(3, 1, np.int32))
    step.upload(s1)
    s1.close()
    syncs = host.sync_count
    step.write("a", np.full(3, 2, np.int32))
    step.upload(s2)
    assert host.sync_count == syncs + 1 and step.fence_waits == 1
    s2.synchronize()
    assert step.tensors["a"].reshape((3,)).to_numpy().tolist() == [2, 2, 2]
    step.close()
    arena.close()
    s2.close()


def test_a_prepared_group_is_copied_until_the_device_holds_all_of_it(host):
    """write_prepared copies the group's bytes (zeros past each value) and skips it only while the device block
    holds every one of its constants: device work that rewrote any name of it sends the group again."""
    arena, step = _block(host)
    s = Stream.create(host)
    a, b = constant(np.array([1, 2, 3], np.int32)), constant(np.array([4, 5], np.int32))
    group = step.group(("a", "b"), (a, b))
    step.write("a", constant(np.full(8, 9, np.int32)))  # the zeros between a's values and b replace these
    step.write_prepared(group)
    step.upload(s)
    s.synchronize()
    assert step.tensors["a"].reshape((8,)).to_numpy().tolist() == [1, 2, 3, 0, 0, 0, 0, 0]
    assert step.tensors["b"].reshape((2,)).to_numpy().tolist() == [4, 5]
    step.write_prepared(group)
    assert step.skipped == 2 and not step.pending, "the device holds both: nothing is written"
    step.overwritten(["b"])  # device work rewrote b alone
    step.write_prepared(group)
    assert step.pending, "b is no longer held: the group is written again"
    step.close()
    arena.close()
    s.close()


def test_a_group_of_names_not_next_to_each_other_is_refused_every_time(host):
    """a and c have b between them: their group is refused, again on a second try (only names found next to each
    other are remembered), while a and b make a group."""
    arena, step = _block(host)
    one = constant(np.ones(1, np.int32))
    for _ in range(2):
        with pytest.raises(TrtioError, match=r"names \['a', 'c'\], which are not next to each other"):
            step.group(("a", "c"), (one, constant(np.ones(1, np.int64))))
    assert step.group(("a", "b"), (one, one)).names == ("a", "b")
    step.close()
    arena.close()


def test_a_prepared_group_written_over_a_held_constant_makes_the_block_forget_it(host):
    """A constant the device held in a name the group then writes is sent again when next written."""
    arena, step = _block(host)
    s = Stream.create(host)
    ones = constant(np.ones(8, np.int32))
    step.write("a", ones)
    step.upload(s)
    step.write_prepared(step.group(("a", "b"), (constant(np.array([7], np.int32)), constant(np.zeros(1, np.int32)))))
    step.write("a", ones)
    assert step.skipped == 0, "the group wrote over a: the constant is no longer held"
    step.upload(s)
    s.synchronize()
    assert step.tensors["a"].reshape((8,)).to_numpy().tolist() == [1] * 8
    other_arena, other = _block(host)
    with pytest.raises(TrtioError, match="write_prepared takes a group this block laid out"):
        other.write_prepared(step.group(("a",), (ones,)))
    for c in (step, other, arena, other_arena, s):
        c.close()


def test_values_device_work_wrote_are_held_and_an_upload_over_them_copies_them_again(host):
    """device_wrote: device work (not an upload) put a constant into b. Writing that constant again copies nothing,
    and an upload of a byte range over b (a and c written) copies those values into b, not the older bytes an
    upload last sent there. A value that is no constant or does not fit is refused."""
    arena, step = _block(host)
    s = Stream.create(host)
    step.write_all(("a", "b", "c"), (np.zeros(8, np.int32), np.full(8, 5, np.int32), np.zeros(4, np.int64)))
    step.upload(s)
    made = constant(np.arange(8, dtype=np.int32))
    step.tensors["b"].reshape((8,)).copy_from(made, s)  # the device work
    step.device_wrote("b", made)
    uploads = step.uploads
    step.write("b", made)
    step.upload(s)
    assert step.uploads == uploads and step.skipped == 1, "the block holds it: nothing is copied"
    step.write("a", np.ones(8, np.int32))
    step.write("c", np.ones(4, np.int64))
    step.upload(s)  # one copy from a to c, over b
    s.synchronize()
    assert step.tensors["b"].reshape((8,)).to_numpy().tolist() == list(range(8))
    with pytest.raises(TrtioError, match="device_wrote takes a constant"):
        step.device_wrote("b", np.arange(8, dtype=np.int32))
    with pytest.raises(CapacityError, match="'b' holds 8 values"):
        step.device_wrote("b", constant(np.arange(9, dtype=np.int32)))
    step.close()
    arena.close()
    s.close()


# -- UploadRing: the one staging ring ---------------------------------------------------------------------


class _Behind(HostBackend):
    """A device that has finished nothing, until the host waits for an event (then that event's work is done)."""

    def __init__(self) -> None:
        super().__init__()
        self.waited: list[int] = []
        self.caught_up = False  # True: the device has finished everything enqueued

    def query_event(self, event: int) -> bool:
        return self.caught_up

    def synchronize_event(self, event: int) -> None:
        self.waited.append(event)
        super().synchronize_event(event)


def _ring(backend, shape=(4,), dtype="int32", slots=INPUT_RING_SLOTS):
    arena = Arena([UploadRing.request("h", shape, dtype, slots=slots), TensorRequest.of("d", shape, dtype)],
                  backend=backend)
    return arena, UploadRing(arena["h"], backend, slots=slots, title="ring h")


def test_upload_ring_refuses_use_after_close(host):
    arena, ring = _ring(host)
    events = host.live_events
    with ring:
        ring.upload(np.arange(4, dtype=np.int32), arena["d"])
        np.testing.assert_array_equal(arena["d"].to_numpy(), np.arange(4))
    assert ring.is_closed and host.live_events == events - INPUT_RING_SLOTS, "its fence events are destroyed"
    with pytest.raises(ClosedError, match="ring h is closed"):
        ring.upload(np.arange(4, dtype=np.int32), arena["d"])
    arena.close()


def test_upload_ring_checks_its_memory_and_what_it_uploads(host):
    arena = Arena([TensorRequest.of("h", (4,), "int32", Location.PINNED), TensorRequest.of("d", (4,), "int32"),
                   TensorRequest.of("f", (4,), "float32")], backend=host)
    with pytest.raises(InvalidValueError, match="'d'.*pinned or host memory"):
        UploadRing(arena["d"], host)
    with pytest.raises(InvalidValueError, match="lives on"):
        UploadRing(arena["h"], HostBackend())
    with UploadRing(arena["h"], host, slots=1) as ring:
        with pytest.raises(TrtioError, match="numpy dtype int32 cannot be uploaded into tensor 'f' of float32"):
            ring.upload(np.zeros(4, np.int32), arena["f"])
        with pytest.raises(CapacityError, match="tensor 'd': shape \\(5,\\)"):
            ring.upload(np.zeros(5, np.int32), arena["d"])
    with UploadRing(arena["h"], host, slots=2) as ring, pytest.raises(CapacityError, match="'h'.*8-byte slots"):
        ring.upload(np.zeros(4, np.int32), arena["d"])
    arena.close()


def test_upload_ring_waits_only_beyond_its_depth_and_once_per_fence() -> None:
    """An upload ring fences its slots in groups of half its slots (the one rule): with a device that has run
    none of the copies, a host up to the ring's depth ahead never waits; beyond it, the first upload into a group's
    slots waits for that group's event, once; once the device has run the copies none waits; the values of every
    upload reach the device (the slots never mix)."""
    be = _Behind()
    before = be.alloc_count
    arena, ring = _ring(be)
    assert be.alloc_count - before == 2, "one allocation per location: the ring is one pinned block"
    assert arena["h"].shape == (INPUT_RING_SLOTS, 4) and ring.slot_capacity == 16
    s = Stream.create(be)
    with ring:
        for i in range(INPUT_RING_SLOTS):
            ring.upload(np.full(4, i, np.int32), arena["d"], s)
            np.testing.assert_array_equal(arena["d"].to_numpy(), np.full(4, i))
        assert be.waited == [] and ring.fence_waits == 0, "a ring ahead of the device: no upload waits"
        group = INPUT_RING_SLOTS // 2
        for i in range(2 * INPUT_RING_SLOTS):
            ring.upload(np.full(4, 10 + i, np.int32), arena["d"], s)
            np.testing.assert_array_equal(arena["d"].to_numpy(), np.full(4, 10 + i))
            assert ring.fence_waits == i // group + 1, "the first upload into a group's slots waits, once"
        be.caught_up, waits = True, len(be.waited)
        for i in range(2 * INPUT_RING_SLOTS):
            ring.upload(np.full(4, 30 + i, np.int32), arena["d"], s)
        assert len(be.waited) == waits, "a device that has run the copies: the ring goes round without waiting"
    arena.close()
    s.close()


def test_upload_ring_uploads_rows_into_a_block_and_leaves_the_view(host) -> None:
    """``upload_rows`` copies new rows among a block's rows (one 2D copy); ``reshape=False`` leaves the device
    tensor's view as its binder set it."""
    arena = Arena([UploadRing.request("h", (2, 3, 4), "float32", 2), TensorRequest.of("d", (2, 5, 4), "float32")],
                  backend=host)
    dev = arena["d"]
    dev.copy_from(np.zeros((2, 5, 4), np.float32))
    s = Stream.create(host)
    with UploadRing(arena["h"], host, slots=2) as ring:
        rows = np.arange(2 * 2 * 4, dtype=np.float32).reshape(2, 2, 4)
        ops = host.op_count
        ring.upload_rows(rows, dev, 3 * 4 * 4, 5 * 4 * 4, s)  # rows 3..4 of each sequence's 5
        assert host.op_count - ops == 1, "one 2D copy"
        got = dev.to_numpy()
        np.testing.assert_array_equal(got[:, 3:], rows)
        np.testing.assert_array_equal(got[:, :3], 0)
        ring.upload(np.ones((2, 2, 4), np.float32), dev, s, reshape=False)
        assert dev.shape == (2, 5, 4), "the view stays"
        np.testing.assert_array_equal(dev.to_numpy().reshape(-1)[:16], 1)
        with pytest.raises(CapacityError, match="pass tensor 'd'"):
            ring.upload_rows(rows, dev, 4 * 4 * 4, 5 * 4 * 4, s)
    arena.close()
    s.close()


class _Kept:
    """Something a step's copy reads, whose collection a test can see."""


def test_upload_ring_keeps_what_a_use_reads_until_its_fence_has_completed() -> None:
    """What a use hands the ring (``keep=``, ``hold``) stays referenced until the use's fence has completed:
    past the group's fence (recorded, not yet run) it is still held; once the device has run it, the next use of
    the slot lets it go; ``wait()`` lets everything go."""
    be = _Behind()
    arena, ring = _ring(be)
    s = Stream.create(be)
    kept = _Kept()
    gone = weakref.ref(kept)
    ring.hold(kept, s)
    ring.upload(np.zeros(4, np.int32), arena["d"], s, keep=_Kept())
    del kept
    gc.collect()
    assert gone() is not None, "held while its fence has not completed"
    for _ in range(INPUT_RING_SLOTS - 2):  # every other slot
        ring.upload(np.zeros(4, np.int32), arena["d"], s)
    gc.collect()
    assert gone() is not None, "a slot's keep goes only when the slot is used again, after its fence"
    be.caught_up = True
    ring.upload(np.zeros(4, np.int32), arena["d"], s)  # slot 0 again: its fence has completed
    gc.collect()
    assert gone() is None and ring.fence_waits == 0, "the fence completed and the slot was reused: let go"
    ring.wait()
    assert ring._kept == [None] * INPUT_RING_SLOTS
    ring.close()
    arena.close()
    s.close()


def test_a_large_upload_takes_the_last_slot_again_once_its_copy_has_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """An upload of WARM_BYTES or more (here 16: every upload of 4 int32) writes the slot the last upload used where
    that upload's copy has run (its bytes still in the host's caches); while the device has run none of the copies,
    the ring goes round as before, never writing a slot whose copy is pending and never waiting within its depth;
    a smaller upload always goes round. Every upload's values reach the device."""
    import trtio._staging

    class Sources(_Behind):
        def __init__(self) -> None:
            super().__init__()
            self.sources: list[int] = []
            self.into = 0  # the device tensor the uploads copy into

        def memcpy(self, dst: int, src: int, nbytes: int, stream: int) -> None:
            if dst == self.into:
                self.sources.append(src)
            super().memcpy(dst, src, nbytes, stream)

    be = Sources()
    arena, ring = _ring(be)
    be.into = arena["d"].data_ptr
    s = Stream.create(be)
    with ring:
        monkeypatch.setattr(trtio._staging, "WARM_BYTES", 16)
        be.caught_up = True
        for i in range(3):
            ring.upload(np.full(4, i, np.int32), arena["d"], s)
            np.testing.assert_array_equal(arena["d"].to_numpy(), np.full(4, i))
        assert len(set(be.sources)) == 1, f"a device that ran each copy: one slot again: {be.sources}"
        be.caught_up = False
        be.sources.clear()
        for i in range(INPUT_RING_SLOTS - 1):  # (the last slot's copy is pending too: its fence was recorded late)
            ring.upload(np.full(4, 10 + i, np.int32), arena["d"], s)
            np.testing.assert_array_equal(arena["d"].to_numpy(), np.full(4, 10 + i))
        assert len(set(be.sources)) == INPUT_RING_SLOTS - 1, "copies pending: each upload in a slot of its own"
        assert ring.fence_waits == 0 and be.waited == []
        be.caught_up = True
        be.sources.clear()
        monkeypatch.setattr(trtio._staging, "WARM_BYTES", 17)
        for i in range(INPUT_RING_SLOTS):
            ring.upload(np.full(4, 30 + i, np.int32), arena["d"], s)
        assert len(set(be.sources)) == INPUT_RING_SLOTS, "a smaller upload goes round the ring"
    arena.close()
    s.close()
