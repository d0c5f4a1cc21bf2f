"""Real-graph parity of LoRA (DESIGN §17): NVIDIA's exported Qwen3 graph with ``insert-lora``'s LoRA inputs, driven by
trtio with two adapters ``process-lora`` wrote, equals Hugging Face + PEFT on the merged weights request by request
across ``set_lora`` switches; a wrong adapter binding fails the check; and the graph as NVIDIA's chain names its LoRA
inputs (after graph nodes) binds and runs the base model, refusing an adapter.

The fixture (``tests/fixtures/parity/qwen3-lora``, ``scripts/parity_cases/lora.py``): ``llm/`` is the export with each
weight MatMul renamed after its module before ``insert-lora`` (a step outside NVIDIA's chain: its README says why),
``nodes/`` the same export through ``insert-lora`` alone. Adapter ``a``: PEFT r 8, alpha 16 on o/gate/up/down; ``b``:
r 2, alpha 1 on every projection, its q/k/v folded into the export's fused ``qkv_proj_fused`` (``b-unfused`` is
``process-lora``'s output as written).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest

import trtio
from tests._parity import TOLERANCE, Case, Compare, ParityMismatch, Seq, _embeds, decode_all
from trtio import ConfigError, InvalidValueError
from trtio.families.lora.adapters import LORA_A, LORA_B, LoraAdapter, LoraInputs

CASE = "qwen3-lora"
ADAPTERS = ("a", "b", "b-unfused")
SWITCH = ("a", "b", None, "a")  # the requests' adapters, in order: a switch between each two
Hook = Callable[[dict[str, np.ndarray]], None]


def adapters(case: Case) -> dict[str, LoraAdapter]:
    return {name: LoraAdapter.load(case.root / "adapters" / name) for name in ADAPTERS}


@contextmanager
def lora_setup(case: Case, role: str = "llm", backend: str = "host", graphs: bool = False,
               hook: Hook | None = None) -> Iterator[Any]:
    engine = case.engine(role, backend)
    engine.input_hook = hook
    cfg = trtio.LLMEngineConfig.from_edgellm(engine.config, what=f"{case.name}/{role}/config.json")
    with trtio.create_for_llm(engine, cfg, graphs=graphs, backend=backend) as setup:
        yield setup


def request(setup: Any, case: Case, cmp: Compare, purpose: str, decodes: int | None = None) -> None:
    """The sequences of ``purpose`` as one request: prefilled together, decoded to the end of HF's greedy
    continuation (or ``decodes`` steps), each row compared, then released."""
    table, seqs = case.table(), case.of(purpose)
    x, lens = _embeds(table, [s.prompt for s in seqs])
    logits = setup.prefill(x, lens).to_numpy()
    for i, s in enumerate(seqs):
        cmp.row(s, s.prompt_length - 1, logits[i], f"prefill, adapter {purpose}")
        cmp.token(s, s.prompt_length - 1, int(logits[i].argmax()), f"prefill, adapter {purpose}")
    steps = case.meta["continuation"] - 1 if decodes is None else decodes
    decode_all(setup, table, seqs, cmp, [s.prompt_length - 1 for s in seqs], steps)
    setup.release(list(range(len(seqs))))


def switch(setup: Any, case: Case, cmp: Compare, order: tuple[str | None, ...] = SWITCH,
           decodes: int | None = None) -> None:
    """Requests with the adapters of ``order`` (None: no adapter), ``set_lora`` between each two; each request's
    rows equal HF's on the base merged with its adapter (PEFT's ``merge_and_unload``)."""
    found = adapters(case)
    for name in order:
        adapter = None if name is None else found[name]
        setup.set_lora(adapter)
        assert setup.lora is adapter
        request(setup, case, cmp, name or "none", decodes)


def run_switch(order: tuple[str | None, ...] = SWITCH, backend: str = "host", graphs: bool = False,
               hook: Hook | None = None, cmp: Compare | None = None, decodes: int | None = None) -> Compare:
    case = Case(CASE)
    cmp = cmp if cmp is not None else Compare()
    with lora_setup(case, backend=backend, graphs=graphs, hook=hook) as setup:
        switch(setup, case, cmp, order, decodes)
    return cmp


# -- the LoRA switch equals HF + PEFT -------------------------------------------------------------------------------


@pytest.mark.parametrize("graphs", [False, True])
def test_a_lora_switch_between_requests_equals_hugging_face_with_each_adapter_merged(graphs: bool) -> None:
    """a, then b, then no adapter, then a again: each request's rows equal HF with its adapter merged (with graphs:
    a's decode graphs, captured at its first request, replayed at its second after b's and none's)."""
    case, cmp = Case(CASE), Compare()
    with lora_setup(case, graphs=graphs) as setup:
        switch(setup, case, cmp)
        if graphs:
            assert setup.graph_stats.graphs >= 3 and setup.graph_stats.hits >= 6
    assert cmp.rows == 4 * 2 * 8 and cmp.worst <= TOLERANCE


def test_the_fixtures_adapters_are_what_the_engine_takes() -> None:
    """Adapter a binds o/gate/up/down at rank 8, b every module at rank 2 and the fused qkv at 6 (its q/k/v folded:
    the same update as process-lora's three pairs), and each adapter moves HF's logits well past the tolerance."""
    case = Case(CASE)
    found = adapters(case)
    engine = case.engine()
    inputs = LoraInputs.from_engine(trtio._engine.EngineIO.from_engine(engine), 8)
    assert inputs is not None and inputs.takes_adapters and not inputs.node_named and len(inputs.modules) == 20
    for name in ("a", "b"):
        assert not inputs.problems(found[name]), name
    assert [found[n].name for n in ADAPTERS] == list(ADAPTERS)  # named after process-lora's output folders
    assert set(found["a"].ranks.values()) == {8} and len(found["a"].modules) == 16
    assert {m: r for m, r in found["b"].ranks.items() if "layers.0." in m} == {
        "model.layers.0.self_attn.qkv_proj_fused": 6, "model.layers.0.self_attn.o_proj": 2,
        "model.layers.0.mlp.gate_proj": 2, "model.layers.0.mlp.up_proj": 2, "model.layers.0.mlp.down_proj": 2}
    unfused = found["b-unfused"].weights
    for layer in range(4):
        a, b = (x.astype(np.float32) for x in found["b"].weights[f"model.layers.{layer}.self_attn.qkv_proj_fused"])
        parts = [unfused[f"model.layers.{layer}.self_attn.{p}"] for p in ("q_proj", "k_proj", "v_proj")]
        want = np.concatenate([pa.astype(np.float32) @ pb.astype(np.float32) for pa, pb in parts], axis=1)
        np.testing.assert_array_equal(a @ b, want)
    for name, moved in case.meta["adapter_moves_base_logits_by_at_least"].items():
        assert moved > 20 * TOLERANCE, name


def test_an_adapter_on_q_k_v_the_export_fused_is_refused_naming_the_fused_module() -> None:
    """process-lora's output of a PEFT adapter on q_proj / k_proj / v_proj names modules the ONNX export fused into
    qkv_proj_fused: refused naming them (Edge-LLM's runtime would bind no weight of theirs, silently)."""
    case = Case(CASE)
    found = adapters(case)
    with lora_setup(case) as setup:
        setup.set_lora(found["a"])
        with pytest.raises(InvalidValueError) as info:
            setup.set_lora(found["b-unfused"])
        assert setup.lora is found["a"]
        cmp = Compare()
        request(setup, case, cmp, "a")  # still adapter a
    msg = str(info.value)
    assert msg.count("fuses q/k/v into") == 12 and "model.layers.3.self_attn.v_proj: the engine 'qwen3-lora/llm' has " \
        "no LoRA input for this module: it fuses q/k/v into model.layers.3.self_attn.qkv_proj_fused (Edge-LLM's ONNX " \
        "export); fold the adapter's q_proj, k_proj, v_proj into that module" in msg
    assert cmp.worst <= TOLERANCE


# -- the graph as insert-lora names it: inputs after graph nodes ------------------------------------------------------


def test_an_engine_whose_lora_inputs_are_named_after_graph_nodes_runs_the_base_model_and_refuses_an_adapter() -> None:
    """NVIDIA's chain alone (export + insert-lora) names every LoRA input ode_linear_N: bound at rank 0, the engine
    equals HF's base model; set_lora refuses an adapter saying why, and the engine goes on as it was."""
    case = Case(CASE)
    found = adapters(case)
    with lora_setup(case, role="nodes") as setup:
        inputs = setup._features.part("lora")._slots.inputs
        assert len(inputs.modules) == len(inputs.node_named) == 20 and inputs.node_named[0] == "ode_linear"
        assert not inputs.takes_adapters
        cmp = Compare()
        request(setup, case, cmp, "none")
        for name in ("a", "b"):
            with pytest.raises(ConfigError) as info:
                setup.set_lora(found[name])
            assert str(info.value).startswith("ode_linear.lora_A.weight: set_lora: engine 'qwen3-lora/nodes' takes no "
                                              "LoRA adapter: 20 of its 20 LoRA modules are named after ONNX graph "
                                              "nodes (ode_linear, ode_linear_1, ode_linear_2, ...)")
            assert "no adapter's weights can be matched to them" in str(info.value)
        setup.set_lora(None)
        assert setup.lora is None
        request(setup, case, cmp, "none")
        assert cmp.rows == 2 * 2 * 8 and cmp.worst <= TOLERANCE


# -- planted bugs: a wrong adapter binding fails the check ------------------------------------------------------------


class Measure(Compare):
    """Compares every row without stopping: the worst |Δ| and the greedy tokens that differ."""

    def __init__(self) -> None:
        super().__init__(tolerance=float("inf"))
        self.tokens_off = 0

    def token(self, seq: Seq, position: int, got: int, what: str) -> None:
        try:
            super().token(seq, position, got, what)
        except ParityMismatch:
            self.tokens_off += 1


def _lora(inputs: dict[str, np.ndarray]) -> list[str]:
    return [n for n in inputs if n.endswith((LORA_A, LORA_B))]


def _rank(inputs: dict[str, np.ndarray], module: str) -> int:
    return int(inputs[module + LORA_A].shape[1])


def _bound(inputs: dict[str, np.ndarray]) -> str | None:
    """Which fixture adapter the step's inputs hold: b binds the fused qkv (rank 6), a binds o_proj without it."""
    if _rank(inputs, "model.layers.0.self_attn.qkv_proj_fused"):
        return "b"
    return "a" if _rank(inputs, "model.layers.0.self_attn.o_proj") else None


def _bind(inputs: dict[str, np.ndarray], adapter: LoraAdapter | None) -> None:
    """Every LoRA input replaced by ``adapter``'s arrays (a module it leaves out, and None: rank 0)."""
    for name in _lora(inputs):
        module, side = (name[:-len(LORA_A)], 0) if name.endswith(LORA_A) else (name[:-len(LORA_B)], 1)
        pair = adapter.weights.get(module) if adapter is not None else None
        shape = inputs[name].shape
        inputs[name] = pair[side] if pair is not None else np.zeros((shape[0], 0) if side == 0 else (0, shape[1]),
                                                                    np.float16)


def _when(adapter: str | None, bug: Hook) -> Hook:
    def hook(inputs: dict[str, np.ndarray]) -> None:
        if _bound(inputs) == adapter:
            bug(inputs)
    return hook


def _a_while_b(found: dict[str, LoraAdapter]) -> Hook:
    return _when("b", lambda inputs: _bind(inputs, found["a"]))


def _b_after_none(found: dict[str, LoraAdapter]) -> Hook:
    return _when(None, lambda inputs: _bind(inputs, found["b"]))


def _none_while_a(found: dict[str, LoraAdapter]) -> Hook:
    return _when("a", lambda inputs: _bind(inputs, None))


def _b_zeroed(_found: dict[str, LoraAdapter]) -> Hook:
    def bug(inputs: dict[str, np.ndarray]) -> None:
        for name in _lora(inputs):
            if name.endswith(LORA_B):
                inputs[name] = np.zeros_like(inputs[name])
    return _when("b", bug)


def _half_rank(_found: dict[str, LoraAdapter]) -> Hook:
    def bug(inputs: dict[str, np.ndarray]) -> None:  # each module bound at half its rank: the rest of A and B dropped
        for name in _lora(inputs):
            r = inputs[name].shape[1 if name.endswith(LORA_A) else 0]
            inputs[name] = inputs[name][:, :r // 2] if name.endswith(LORA_A) else inputs[name][:r // 2]
    return _when("a", bug)


def _unscaled(_found: dict[str, LoraAdapter]) -> Hook:
    def bug(inputs: dict[str, np.ndarray]) -> None:  # lora_alpha / r (2 for a) not folded into B
        for name in _lora(inputs):
            if name.endswith(LORA_B):
                inputs[name] = (inputs[name] / 2).astype(np.float16)
    return _when("a", bug)


def _gate_up_swapped(_found: dict[str, LoraAdapter]) -> Hook:
    def bug(inputs: dict[str, np.ndarray]) -> None:  # bound by position, not by name: two modules of one shape
        for layer in range(4):
            for side in (LORA_A, LORA_B):
                gate, up = (f"model.layers.{layer}.mlp.{m}{side}" for m in ("gate_proj", "up_proj"))
                inputs[gate], inputs[up] = inputs[up], inputs[gate]
    return _when("a", bug)


def _layers_shifted(_found: dict[str, LoraAdapter]) -> Hook:
    def bug(inputs: dict[str, np.ndarray]) -> None:  # layer l bound to layer l + 1's adapter (the last to layer 0's)
        held = {n: inputs[n] for n in _lora(inputs)}
        for name in held:
            layer = int(name.split(".")[2])
            inputs[name] = held[name.replace(f"layers.{layer}.", f"layers.{(layer + 1) % 4}.", 1)]
    return _when("a", bug)


# (the requests it runs, the hook): each plants one wrong LoRA binding, as a trtio bug would make it.
BUGS: dict[str, tuple[tuple[str | None, ...], Callable[[dict[str, LoraAdapter]], Hook]]] = {
    "adapter a's weights bound while b's request runs": (("a", "b"), _a_while_b),
    "adapter b still bound after set_lora(None)": (("b", None), _b_after_none),
    "no adapter bound after set_lora(a)": (("a",), _none_while_a),
    "b's lora_B zeroed": (("b",), _b_zeroed),
    "each module bound at half its rank": (("a",), _half_rank),
    "lora_alpha / r not folded into B": (("a",), _unscaled),
    "gate_proj and up_proj bound to each other's inputs": (("a",), _gate_up_swapped),
    "each layer bound to the next layer's adapter": (("a",), _layers_shifted),
}


@pytest.mark.parametrize("bug", list(BUGS))
def test_a_planted_lora_binding_bug_fails_parity(bug: str) -> None:
    """Each request prefilled and decoded twice (the bugs act on every step alike)."""
    order, make = BUGS[bug]
    found = adapters(Case(CASE))
    cmp = run_switch(order, hook=make(found), cmp=Measure(), decodes=2)
    assert isinstance(cmp, Measure)
    assert cmp.worst > TOLERANCE, f"{bug}: worst |Δ logits| {cmp.worst:.4f}, the check would pass"


# -- the cuda backend -------------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("graphs", [False, True])
def test_a_lora_switch_equals_hugging_face_on_the_cuda_backend(graphs: bool) -> None:
    """The same on device memory (the graph in a CUDA host function between stream-ordered copies), also replayed
    from CUDA graphs kept per adapter."""
    cmp = run_switch(backend="cuda", graphs=graphs)
    assert cmp.rows == 4 * 2 * 8 and cmp.worst <= TOLERANCE


@pytest.mark.gpu
def test_the_node_named_engine_equals_the_base_model_on_the_cuda_backend() -> None:
    case = Case(CASE)
    cmp = Compare()
    with lora_setup(case, role="nodes", backend="cuda", graphs=True) as setup:
        request(setup, case, cmp, "none")
    assert cmp.rows == 2 * 8 and cmp.worst <= TOLERANCE
