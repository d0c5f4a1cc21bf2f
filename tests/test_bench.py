"""``trtio bench`` (trtio/_tools/bench.py): what it times beside each helper, and the inputs it feeds the steps.
Timings are reported, never asserted."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from typing import Any

import pytest

from trtio._cli import main
from trtio._stream import Stream
from trtio._tools import bench
from trtio._tools.bench import ROUND, copy_row


def _rows(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, dict[str, dict[str, float]]]:
    assert main(["bench", "--backend", "dry-run", "--steps", "3", "--rounds", "1", "--json", *args]) == 0
    out: dict[str, dict[str, dict[str, float]]] = json.loads(capsys.readouterr().out)
    return out


def test_host_inputs_time_one_copy_of_each_helpers_input_beside_it(capsys: pytest.CaptureFixture[str]) -> None:
    """``--inputs host``: numpy arrays feed every step; beside each helper that takes embeddings, one np.copyto of
    its input (0 device operations); a host input adds one staged copy to a step (a proposal level's 2D copy of
    its new rows)."""
    host = _rows(capsys, "--inputs", "host", "--contract", "ragged")["ragged"]
    device = _rows(capsys, "--contract", "ragged")["ragged"]
    for helper in ("LLMSetup.decode", "SpecDecodeSetup.draft_propose", "SpecDecodeSetup.verify",
                   "SpecDecodeSetup.draft_accept"):
        assert host[copy_row(helper)]["device_ops"] == 0
        assert host[helper]["device_ops"] == device[helper]["device_ops"] + 1, helper
    assert copy_row("SpecDecodeSetup.accept") not in host, "accept takes no embeddings"
    assert host[ROUND]["device_ops"] == device[ROUND]["device_ops"] + 5, "3 levels, verify and the catch-up"
    assert main(["bench", "--backend", "dry-run", "--steps", "3", "--rounds", "1", "--inputs", "host",
                 "--contract", "batch"]) == 0
    text = capsys.readouterr().out
    assert "host inputs" in text and "beyond np.copyto, x decode |" in text


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
def test_torch_inputs_feed_the_steps_with_the_decode_step_fed_numpy_beside(capsys: pytest.CaptureFixture[str]) -> None:
    """``--inputs torch`` works with a CPU torch build (host memory: the steps read it as numpy); the decode step,
    each spec phase and the round fed a torch tensor and fed numpy (timed beside them) enqueue alike."""
    rows = _rows(capsys, "--inputs", "torch", "--contract", "batch")["batch"]
    assert rows["LLMSetup.decode"]["device_ops"] == rows["LLMSetup.decode, fed numpy"]["device_ops"] == 2
    assert rows["SpecDecodeSetup.verify"]["device_ops"] == 2
    for phase in ("SpecDecodeSetup.draft_propose", "SpecDecodeSetup.verify", "SpecDecodeSetup.draft_accept", ROUND):
        assert rows[phase]["device_ops"] == rows[f"{phase}, fed numpy"]["device_ops"], phase
    assert f"{ROUND}, fed numpy" in rows and "SpecDecodeSetup.accept, fed numpy" not in rows


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
def test_decode_rows_compared_side_by_side_each_follow_the_engines_own_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """The decode fed torch and the decode fed the other input are timed in the same place of the loop: each right
    after the engine's own two rows (what ran just before a call warms or cools the host's caches)."""
    calls: list[str] = []
    real = bench._Clock.__call__

    def spy(self: bench._Clock, name: str, fn: Callable[[], object]) -> None:
        calls.append(name)
        real(self, name, fn)

    monkeypatch.setattr(bench._Clock, "__call__", spy)
    llm, _ = bench.configs("batch", 1024)
    backend = bench.bench_backend("dry-run")
    stream = Stream.create(backend)
    try:
        bench._llm_rows(llm, backend, stream, 3, bench._Clock(backend, stream), "torch")
    finally:
        stream.close()
    decodes = [i for i, name in enumerate(calls) if name.startswith("LLMSetup.decode")]
    assert {calls[i] for i in decodes} == {"LLMSetup.decode", "LLMSetup.decode, fed numpy"}
    assert len(decodes) == 6
    for i in decodes:
        assert calls[i - 2:i] == ["prepare + execute (decode, graph)", "prepare + execute (decode's own graph)"], i


def test_the_decode_steps_own_graph_and_a_whole_round_are_timed(capsys: pytest.CaptureFixture[str]) -> None:
    out = _rows(capsys)
    for rows in out.values():
        assert rows["prepare + execute (decode's own graph)"]["device_ops"] == 1
        # A level whose parents repeat the last round's is its graph alone (the step block holds its parents); a
        # round's first level reads the round's lengths where the last catch-up left them on the device and its roots
        # repeat: no upload either.
        assert rows[ROUND]["device_ops"] == 3 * rows["SpecDecodeSetup.draft_propose"]["device_ops"] + sum(
            rows[f"SpecDecodeSetup.{h}"]["device_ops"] for h in ("verify", "accept", "draft_accept"))


def test_a_lora_engines_rows_decode_as_the_plain_engine_and_switch_with_no_device_work(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 37: on the ragged contract, a LoRA build of the LLM decodes with the device work of the plain engine's
    decode, with an adapter or without (its graph replayed), and ``set_lora`` switches adapters by binding the
    adapter's own device copy: no device work (the dry-run backend would count a copy, or an upload's), and the
    decode after it replays that adapter's graph alone."""
    from trtio._tools.bench_lora import ROWS

    rows = _rows(capsys, "--contract", "ragged")["ragged"]
    decode = rows["LLMSetup.decode"]["device_ops"]
    no_adapter, adapter, switch, switch_and_decode = (rows[name]["device_ops"] for name in ROWS)
    assert no_adapter == adapter == decode
    assert switch == 0
    assert switch_and_decode == decode


def test_a_round_of_new_paths_every_round_is_timed_beside_the_steady_round(capsys: pytest.CaptureFixture[str],
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Both contracts also time a round whose accepted paths change every round (a serving loop's), and the ragged
    contract an MTP and a DFlash round of such paths: each round accepts other paths of 1-4 nodes (every call seen
    is recorded), and the round pays one device operation more than the steady round for them (the new paths' commit
    rows: the catch-up lays itself out on the device from them, and on the batch contract writes the next round's
    roots there), while the steady round stays as steady as alone."""
    from trtio._setups.spec_decode import SpecDecodeSetup  # noqa: PLC0415
    from trtio._tools.bench import (  # noqa: PLC0415
        DFLASH_ROUND,
        DFLASH_ROUND_NEW_PATHS,
        MTP_ROUND,
        MTP_ROUND_NEW_PATHS,
        ROUND_NEW_PATHS,
    )

    seen: list[list[list[int]]] = []
    real_accept = SpecDecodeSetup.accept

    def accept(self: SpecDecodeSetup, paths: Any, stream: Any = None) -> None:
        seen.append(paths)
        real_accept(self, paths, stream)

    monkeypatch.setattr(SpecDecodeSetup, "accept", accept)
    out = _rows(capsys, "--rounds", "6")
    pairs = [(c, ROUND_NEW_PATHS, ROUND) for c in out] + [("ragged", MTP_ROUND_NEW_PATHS, MTP_ROUND),
                                                          ("ragged", DFLASH_ROUND_NEW_PATHS, DFLASH_ROUND)]
    for contract, serving, steady in pairs:
        rows = out[contract]
        assert rows[steady]["device_ops"] < rows[serving]["device_ops"] <= rows[steady]["device_ops"] + 1, \
            (contract, serving)
    for contract, rows in out.items():
        assert rows[ROUND]["device_ops"] == 3 * rows["SpecDecodeSetup.draft_propose"]["device_ops"] + sum(
            rows[f"SpecDecodeSetup.{h}"]["device_ops"] for h in ("verify", "accept", "draft_accept")), contract
    # (the steady rounds accept 4 nodes a sequence, the MTP round 4 too, the DFlash round 8)
    new_ones = [p for p in seen if max(map(len, p)) <= 4 and min(map(len, p)) < 4]
    assert len(new_ones) == 4 * (6 + 2), "6 timed rounds of new paths after 2 warm-up rounds: 2 EAGLE, MTP, DFlash"
    assert all(1 <= len(path) <= 4 for p in new_ones for path in p)
    assert all(a != b for a, b in zip(new_ones, new_ones[1:])), "the paths change every round"


def test_an_mtp_round_is_timed_with_its_device_operations(capsys: pytest.CaptureFixture[str]) -> None:
    """The ragged contract's MTP round (an 8B-class base feeding its last layer's [T, H] stream to a one-layer
    draft): 2 chained proposals (level 1 comes from the catch-up's logits), a verify of the 4-node chain, accept and
    the catch-up, each one graph replay, and the round's first level's upload of its lengths and roots: at most 6."""
    from trtio._tools.bench import MTP_ROUND  # noqa: PLC0415

    out = _rows(capsys, "--contract", "ragged")
    rows = out["ragged"]
    assert MTP_ROUND in rows and "batch" not in out
    # 2 levels (the first also uploads the round's lengths and roots), the verify (its rows, offsets included, are the
    # base's own: the block holds them from the last round), accept and the catch-up: 2 + 1 + 1 + 1 + 1
    assert rows[MTP_ROUND]["device_ops"] <= 6


def test_a_dflash_round_is_timed_with_its_device_operations(capsys: pytest.CaptureFixture[str]) -> None:
    """The ragged contract's DFlash round (an 8B-class base feeding its 3 layers' streams [T, 3H] to a one-layer block
    draft, blocks of 8 accepted whole): a verify of the 8-node chain with its staged rows, accept, and the next block
    (its delta's positions and sequences uploaded with the block's tree step, then one graph replay)."""
    from trtio._tools.bench import DFLASH_ROUND  # noqa: PLC0415

    out = _rows(capsys, "--contract", "ragged")
    rows = out["ragged"]
    assert DFLASH_ROUND in rows
    # the verify with its staged rows, accept, the block's upload and its graph: 2 + 1 + 1 + 1
    assert rows[DFLASH_ROUND]["device_ops"] == 5
