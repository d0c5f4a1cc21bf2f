"""The parity fixtures (``tests/fixtures/parity/``, written by ``scripts/make_parity_fixtures.py``) keep nothing of the
machine that exported them: the exporter's per-node stack traces (file paths of its Python environment) are
dropped when a case is written (``strip_stack_traces``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

onnx = pytest.importorskip("onnx")

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "parity"
GRAPHS = sorted(FIXTURES.rglob("*.onnx"))


def _machine_text(graph: Path) -> list[str]:
    """Every node metadata value of ``graph`` that names a file of the machine (a path into site-packages, or the
    stack-trace key itself)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from make_parity_fixtures import STACK_TRACE_KEY  # noqa: PLC0415
    finally:
        sys.path.pop(0)
    model = onnx.load(str(graph), load_external_data=False)
    nodes = [*model.graph.node, *(n for f in model.functions for n in f.node)]
    return [f"{n.name}: {p.key}" for n in nodes for p in n.metadata_props
            if p.key == STACK_TRACE_KEY or "site-packages" in p.value or p.value.startswith("/")]


def test_there_are_graphs_to_check() -> None:
    assert len(GRAPHS) >= 20


@pytest.mark.parametrize("graph", GRAPHS, ids=[str(g.relative_to(FIXTURES)) for g in GRAPHS])
def test_no_fixture_graph_keeps_the_exporters_paths(graph: Path) -> None:
    assert _machine_text(graph) == []
    assert b"site-packages" not in graph.read_bytes()
