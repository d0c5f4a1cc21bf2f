"""trtio._collectives misused: the host all-reduce group and the communicator table refuse what would give a rank
a wrong sum or another rank's communicator (the group's normal use is tested in test_tensor_parallel.py)."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

from trtio import InvalidValueError
from trtio import _collectives as collectives

WAIT = 30.0


def _all_reduce(group: collectives.HostGroup, parts: list[Any]) -> list[Any]:
    out: list[Any] = [None] * len(parts)

    def rank(r: int) -> None:
        try:
            out[r] = group.member(r).all_reduce(parts[r])
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out[r] = exc

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(len(parts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    return out


@pytest.mark.parametrize("shapes", [[(4,), (1,)], [(1,), (4,)], [(2, 2), (4,)]])
def test_partial_sums_of_different_shapes_are_refused_on_every_rank(shapes: list[tuple[int, ...]]) -> None:
    """numpy broadcasting summed [4] and [1] into [2, 2, 2, 2] on both ranks: a silent wrong answer (or, the
    other way round, a bare ValueError). Every rank now raises the same InvalidValueError naming the shapes,
    and the group stays usable."""
    with collectives.HostGroup(2, timeout=WAIT) as group:
        out = _all_reduce(group, [np.ones(s, np.float32) for s in shapes])
        for r in range(2):
            assert isinstance(out[r], InvalidValueError), out[r]
            assert f"all-reduce of rank {r} of 2: the ranks' partial sums differ in shape (rank 0: " \
                   f"{list(shapes[0])}, rank 1: {list(shapes[1])})" in str(out[r])
        out = _all_reduce(group, [np.ones(3, np.float32), np.full(3, 2, np.float32)])
        assert [o.tolist() for o in out] == [[3.0] * 3, [3.0] * 3]


def test_a_partial_sum_that_is_no_array_of_numbers_is_refused() -> None:
    with collectives.HostGroup(1, timeout=WAIT) as group:
        with pytest.raises(InvalidValueError, match="a partial sum is not an array of numbers"):
            group.member(0).all_reduce("abc")


@pytest.mark.parametrize("rank", [-1, 2, "0", 1.0, True])
def test_member_takes_a_rank_of_the_group_only(rank: Any) -> None:
    """member(-1) was rank 1 (a list index), member(2) an IndexError."""
    with collectives.HostGroup(2) as group:
        with pytest.raises(InvalidValueError, match=r"HostGroup.member: rank must be an int in 0\.\.1, got"):
            group.member(rank)
        assert group.member(np.int64(1)).rank == 1


@pytest.mark.parametrize(("kw", "match"), [({"size": True}, "size must be an int >= 1, got True"),
                                           ({"size": 0}, "size must be an int >= 1, got 0"),
                                           ({"size": 2, "timeout": -1}, "timeout must be a number of seconds > 0"),
                                           ({"size": 2, "timeout": "1"}, "timeout must be a number of seconds > 0")])
def test_a_group_of_no_size_or_no_timeout_is_refused(kw: dict[str, Any], match: str) -> None:
    with pytest.raises(InvalidValueError, match=match):
        collectives.HostGroup(**kw)


def test_a_wait_that_times_out_says_so() -> None:
    """The barrier breaks itself when a wait times out; the error said another rank's step had failed."""
    with collectives.HostGroup(2, timeout=0.2) as group:
        with pytest.raises(collectives.CollectiveAbortedError, match=r"all-reduce of rank 0 of 2: a rank did not "
                                                                     r"arrive within 0\.2 s; the group is aborted"):
            group.member(0).all_reduce(np.ones(1, np.float32))
        group.reset()
        group.abort()
        with pytest.raises(collectives.CollectiveAbortedError, match="another rank's step failed"):
            group.member(1).all_reduce(np.ones(1, np.float32))


def test_register_refuses_a_device_twice_and_lists_of_different_lengths() -> None:
    """register([50, 50], [rank 0, rank 1]) registered rank 1 for both: rank 0's engine would have reached
    rank 1's communicator. A length mismatch registered the shorter list silently."""
    with collectives.HostGroup(2) as group:
        members = [group.member(0), group.member(1)]
        with pytest.raises(InvalidValueError, match="register: device 50 is named twice"):
            collectives.register([50, 50], members)
        with pytest.raises(InvalidValueError, match="register: 1 devices for 2 communicators"):
            collectives.register([50], members)
        with pytest.raises(InvalidValueError, match="register: device '5' is not a device id"):
            collectives.register(["5", 6], members)
        for device in (5, 6, 50):
            with pytest.raises(collectives.EngineError, match="no communicator is registered"):
                collectives.communicator(device)
        with pytest.raises(InvalidValueError, match=r"device \[1\] is not a device id"):
            collectives.communicator([1])  # type: ignore[arg-type]
