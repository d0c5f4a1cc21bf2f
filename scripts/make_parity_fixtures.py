#!/usr/bin/env python3
"""Write ``tests/fixtures/parity/<case>/``: NVIDIA's exported graph of a tiny seeded checkpoint, and Hugging Face's
fp32 logits on it, for the real-graph parity tests (``tests/test_parity_*.py``, ``docs/guide/parity.md``).

For each case this script

1. writes a tiny random Hugging Face checkpoint (hidden <= 128, <= 8 layers, vocab <= 512), seeded, its weights
   rounded to float16 values (so Hugging Face's fp32 forward and the fp16 graph compute on the same numbers) and its
   norm weights drawn ``1 + 0.3 N(0, 1)`` (``initializer_range`` 0.2) so that a dropped norm shows in the logits;
2. runs NVIDIA's exporter on it (``tensorrt-edgellm-export CKPT OUT`` with the case's flags) and copies the graph
   (``model.onnx`` + ``model.onnx.data``), ``config.json`` and ``embedding.safetensors`` of each role folder;
3. writes ``builder_config.json`` (what Edge-LLM's builder adds to ``config.json``, per role) and ``profiles.json``
   (the two optimization profiles the real builder function, ``experimental/builder/core/builder.py::
   _setup_llm_profiles``, sets on the graph's inputs with that builder config);
4. draws the case's prompts (seeded; redrawn until every greedy row's top-1/top-2 gap is at least ``GAP``, so the
   greedy tokens are robust to fp16 rounding), runs Hugging Face's fp32 forward on each prompt and its greedy
   continuation, and stores the logits of the rows the tests compare (``reference.npz``, ``reference.json``);
5. writes the case's ``README.md``: versions, seed and command.

It is the only code that needs torch, transformers and the exporter; the tests read the committed files with
``onnx`` and numpy alone. Set-up (a scratch venv outside the repository, about 2 minutes)::

    python3.11 -m venv "$VENV"
    "$VENV/bin/pip" install torch==2.13.0 'tensorrt-edgellm[export]==0.11.0' peft

Run from the repository root: ``"$VENV/bin/python" scripts/make_parity_fixtures.py [--case NAME ...]``.
``experimental/builder/core/builder.py`` imports ``tensorrt`` at module level; the profile recorder imports it
under ``make_edgellm_fixtures._tensorrt_import_stub`` (no TensorRT code runs). The cases live in
``scripts/parity_cases/`` (one module per family, each a ``CASES`` list).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import platform
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "parity"
SCRIPTS = Path(__file__).resolve().parent
GAP = 0.2  # the smallest top-1/top-2 logit gap a greedy row may have (the tests' tolerance is 0.1)
CONTINUATION = 8  # greedy tokens after each prompt
SIZE_LIMIT = 2 * 1024 * 1024  # bytes a case may take (a vision-language pair 3 MB: Case.size_limit)
EXPORT_FILES = ("model.onnx", "model.onnx.data", "config.json", "embedding.safetensors", "d2t.safetensors",
                "preprocessor_config.json", "ple_embedding.safetensors")


@dataclass(frozen=True)
class Sequence:
    """One prompt of a case: ``length`` tokens; ``purpose`` says which scenario uses it; ``marks``: positions inside
    the prompt whose logits the tests also compare (a pinned prefix's last token, a chunk's last token)."""

    purpose: str
    length: int
    marks: tuple[int, ...] = ()


# The scenarios of DESIGN §17 for a text model, shared by the dense families: a batch of three prompts of different
# lengths; one long prompt prefilled in chunks of 48 (rows 47, 95, 143: the third chunk crosses the 128-token page);
# a request admitted into a released slot; a prefix of 133 tokens (a full page and a partial one) pinned and
# continued by 7 more tokens.
TEXT_SEQUENCES = (
    Sequence("batch", 5), Sequence("batch", 11), Sequence("batch", 17),
    Sequence("chunked", 150, marks=(47, 95, 143)),
    Sequence("admit", 9),
    Sequence("prefix", 140, marks=(132,)),
)
TEXT_BUILDER = {"max_batch_size": 4, "max_input_len": 64, "max_kv_cache_capacity": 256}


@dataclass(frozen=True)
class Role:
    """One exported graph of a case: where the export wrote it, its builder config and the builder's spec role."""

    source: str  # the folder under the export's output ("llm", "base/llm", ...)
    builder: dict[str, Any]
    spec_role: str = "none"  # "none", "base" or "draft" (BuildArgs.spec_role)
    spec_type: str = "none"
    checkpoint: str = ""  # this role's Hugging Face checkpoint: a folder under the case's checkpoint ("": itself)
    component: str = "llm"  # BuildArgs.component: "llm", "visual" (a VLM's vision encoder) or "audio" (one profile)
    # Another role's fixture folder whose graph this role shares (another builder config of the same export): no
    # files are copied for it; graphs.json maps the role to that folder.
    graph: str = ""
    # (profiles, graph inputs {name: shape}, config.json, builder config) -> profiles: what Edge-LLM's C++ builder
    # sets where the Python builder function sets nothing (the case module cites the C++ it transcribes).
    amend_profiles: Callable[[dict[str, Any], dict[str, tuple[int, ...]], dict[str, Any], dict[str, Any]],
                             dict[str, Any]] | None = None


@dataclass
class Case:
    """One parity fixture: how to make its checkpoint, how to export it, its builder configs and its references."""

    name: str
    summary: str
    checkpoint: Callable[[Path, int], None]  # (folder, seed): write the HF checkpoint there
    roles: dict[str, Role]  # the fixture's role folder ("llm", "base", "draft") -> the role
    export_flags: tuple[str, ...] = ()
    # (checkpoint, output): run the exporter(s) another way than `tensorrt-edgellm-export CKPT OUT <flags>`
    export: Callable[[Path, Path], None] | None = None
    seed: int = 0
    sequences: tuple[Sequence, ...] = TEXT_SEQUENCES
    reference: Callable[[Case, Path, Path], tuple[dict[str, np.ndarray], dict[str, Any]]] | None = None
    notes: str = ""  # what the README adds (steps outside NVIDIA's chain, and why)
    size_limit: int = SIZE_LIMIT
    extra: dict[str, Any] = field(default_factory=dict)


# -- checkpoints --------------------------------------------------------------------------------------------------


def seeded_model(model_class: Any, config: Any, seed: int) -> Any:
    """``model_class(config)`` with its norm weights drawn ``1 + 0.3 N(0, 1)`` and every weight rounded to a float16
    value (kept in float32: Hugging Face's fp32 forward then computes on exactly what the fp16 graph holds)."""
    import torch

    torch.manual_seed(seed)
    model = model_class(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                param.copy_(1.0 + 0.3 * torch.randn_like(param))
            param.copy_(param.to(torch.float16).to(torch.float32))
    return model


def save_checkpoint(model: Any, folder: Path) -> None:
    """The checkpoint in float16 with the one-line chat template the exporter needs beside it."""
    import torch

    model.to(torch.float16).save_pretrained(folder)
    model.to(torch.float32)
    (folder / "chat_template.jinja").write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")


# -- references ---------------------------------------------------------------------------------------------------


def load_hf(folder: Path) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def hf_logits(model: Any, tokens: np.ndarray) -> np.ndarray:
    """Hugging Face's fp32 logits of every position of ``tokens`` (one sequence)."""
    import torch

    with torch.no_grad():
        return model(torch.tensor(tokens, dtype=torch.long)[None]).logits[0].float().numpy()


def gap(row: np.ndarray) -> float:
    top = np.sort(row)[-2:]
    return float(top[1] - top[0])


def greedy_continuation(tokens: np.ndarray, last_row: Callable[[np.ndarray], np.ndarray],
                        continuation: int = CONTINUATION) -> np.ndarray | None:
    """``tokens`` and their ``continuation`` greedy tokens (``last_row(tokens)``: the logits after ``tokens``), or
    None where a greedy row's top-1/top-2 gap is under GAP (its token would not be robust to fp16 rounding)."""
    for _ in range(continuation):
        row = last_row(tokens)
        if gap(row) < GAP:
            return None
        tokens = np.append(tokens, int(row.argmax()))
    return tokens


def draw(model: Any, vocab: int, length: int, rng: np.random.Generator,
         logits_of: Callable[[Any, np.ndarray], np.ndarray] = hf_logits, tries: int = 2000,
         continuation: int = CONTINUATION) -> tuple[np.ndarray, np.ndarray]:
    """A prompt of ``length`` tokens and its greedy continuation whose every greedy row has a gap >= GAP:
    (tokens [length + continuation], logits of every position)."""
    for _ in range(tries):
        tokens = greedy_continuation(rng.integers(1, vocab, length), lambda t: logits_of(model, t)[-1], continuation)
        if tokens is not None:
            return tokens.astype(np.int32), logits_of(model, tokens[:-1])
    raise RuntimeError(f"no prompt of {length} tokens with {continuation} greedy gaps >= {GAP} in {tries} draws")


def stored_positions(seq: Sequence) -> np.ndarray:
    """The rows the tests compare: the marks, every 16th row of the prompt, and the greedy rows."""
    rows = set(seq.marks) | {p for p in range(seq.length - 1) if p % 16 == 15}
    rows |= set(range(seq.length - 1, seq.length - 1 + CONTINUATION))
    return np.array(sorted(rows), dtype=np.int32)


def causal_reference(case: Case, checkpoint: Path, _out: Path,
                     model: Any = None) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The default reference: for each of the case's sequences, its tokens and HF's logits at its stored rows."""
    model = model if model is not None else load_hf(checkpoint)
    vocab = int(model.config.vocab_size)
    arrays: dict[str, np.ndarray] = {}
    sequences = []
    for i, seq in enumerate(case.sequences):
        rng = np.random.default_rng(case.seed * 1000 + i)
        tokens, logits = draw(model, vocab, seq.length, rng)
        rows = stored_positions(seq)
        arrays[f"tokens_{i}"] = tokens
        arrays[f"positions_{i}"] = rows
        arrays[f"logits_{i}"] = logits[rows].astype(np.float32)
        greedy = logits[seq.length - 1:seq.length - 1 + CONTINUATION]
        sequences.append({"purpose": seq.purpose, "prompt_length": seq.length, "marks": list(seq.marks),
                          "smallest_greedy_gap": round(min(gap(r) for r in greedy), 4)})
    return arrays, {"sequences": sequences, "continuation": CONTINUATION}


# -- the exporter and the builder ---------------------------------------------------------------------------------


def export(checkpoint: Path, out: Path, flags: tuple[str, ...]) -> None:
    exe = Path(sys.executable).with_name("tensorrt-edgellm-export")
    done = subprocess.run([str(exe), str(checkpoint), str(out), *flags], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"tensorrt-edgellm-export failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")


@contextlib.contextmanager
def builder_module() -> Iterator[Any]:
    sys.path.insert(0, str(SCRIPTS))
    try:
        from make_edgellm_fixtures import _tensorrt_import_stub

        with _tensorrt_import_stub():
            builder = importlib.import_module("experimental.builder.core.builder")
        yield builder
    finally:
        sys.path.remove(str(SCRIPTS))


class _Input:
    def __init__(self, name: str, shape: tuple[int, ...]) -> None:
        self.name, self.shape = name, shape


class _Network:
    def __init__(self, inputs: list[_Input]) -> None:
        self._inputs = inputs

    @property
    def num_inputs(self) -> int:
        return len(self._inputs)

    def get_input(self, i: int) -> _Input:
        return self._inputs[i]


class _Profile:
    def __init__(self) -> None:
        self.shapes: dict[str, list[list[int]]] = {}

    def set_shape(self, name: str, lo: Any, opt: Any, hi: Any) -> None:
        self.shapes[name] = [list(lo), list(opt), list(hi)]


class _Recorder:
    """Stands in for the TensorRT builder, its builder config and network in ``_setup_llm_profiles``."""

    def __init__(self) -> None:
        self.profiles: list[_Profile] = []

    def create_optimization_profile(self) -> _Profile:
        return _Profile()

    def add_optimization_profile(self, profile: _Profile) -> None:
        self.profiles.append(profile)


def record_profiles(builder: Any, checkpoint: Path, graph: Path, build: dict[str, Any],
                    spec: dict[str, Any], component: str = "llm", amend: Any = None) -> dict[str, Any]:
    """What ``_setup_llm_profiles`` (``component`` "llm") or ``_setup_component_profile`` (a vision or audio encoder:
    one profile) sets for each input of ``graph`` with the builder arguments ``build`` (then ``amend``, a
    :attr:`Role.amend_profiles`)."""
    import onnx

    model = onnx.load(str(graph), load_external_data=False)
    inputs = [_Input(i.name, tuple(d.dim_value if d.HasField("dim_value") else -1
                                   for d in i.type.tensor_type.shape.dim)) for i in model.graph.input]
    keys = {k: v for k, v in build.items() if k in ("max_batch_size", "max_input_len", "max_kv_cache_capacity",
                                                      "max_lora_rank", "max_verify_tree_size",
                                                      "max_draft_tree_size", "min_image_tokens",
                                                      "max_image_tokens", "max_image_tokens_per_image",
                                                      "min_time_steps", "max_time_steps")}
    args = builder.BuildArgs(model_dir=str(checkpoint), engine_dir=tempfile.mkdtemp(), component=component, **keys,
                             **spec)
    recorder = _Recorder()
    if component != "llm":
        builder._setup_component_profile(recorder, recorder, _Network(inputs), args)
        (only,) = recorder.profiles
        return {name: {"profile0": shapes} for name, shapes in only.shapes.items()}
    cfg = builder.load_device_config(args)
    builder._setup_llm_profiles(recorder, recorder, _Network(inputs), cfg, args)
    ctx, gen = recorder.profiles
    out = {name: {"profile0": ctx.shapes[name], "profile1": gen.shapes.get(name, ctx.shapes[name])}
           for name in ctx.shapes}
    if amend is not None:
        config = json.loads((graph.parent / "config.json").read_text())
        out = amend(out, {i.name: i.shape for i in inputs}, config, build)
    return out


def spec_args(case: Case, ckpt: Path, role: Role) -> dict[str, Any]:
    """The builder's spec arguments for ``role``: its spec role and type, and a speculative pair's partner
    checkpoint (``--draft-model-dir`` for a base, ``--target-model-dir`` for a draft), as the builder wants them."""
    spec: dict[str, Any] = {"spec_role": role.spec_role, "spec_type": role.spec_type}
    partners = {r.spec_role: ckpt / r.checkpoint for r in case.roles.values()}
    if role.spec_role == "base" and "draft" in partners:
        spec["draft_model_dir"] = str(partners["draft"])
    if role.spec_role == "draft" and "base" in partners:
        spec["target_model_dir"] = str(partners["base"])
    return spec


# -- one case -------------------------------------------------------------------------------------------------------


def versions() -> dict[str, str]:
    import importlib.metadata as md

    found = {"python": platform.python_version()}
    for name in ("tensorrt-edgellm", "torch", "transformers", "onnx", "numpy", "peft"):
        with contextlib.suppress(md.PackageNotFoundError):
            found[name] = md.version(name)
    return found


#: The exporter's per-node metadata holding the Python stack of the torch code that made the node: file paths of the
#: machine that exported it, which no fixture keeps.
STACK_TRACE_KEY = "pkg.torch.onnx.stack_trace"


def strip_stack_traces(graph: Path) -> None:
    """Drop :data:`STACK_TRACE_KEY` from every node of ``graph`` (its functions' and subgraphs' too), in place; the
    external weights are left as they are."""
    import onnx  # noqa: PLC0415

    model = onnx.load(str(graph), load_external_data=False)

    def clean(nodes: Any) -> None:
        for node in nodes:
            kept = [p for p in node.metadata_props if p.key != STACK_TRACE_KEY]
            del node.metadata_props[:]
            node.metadata_props.extend(kept)
            for attr in node.attribute:
                if attr.HasField("g"):
                    clean(attr.g.node)
                for g in attr.graphs:
                    clean(g.node)

    clean(model.graph.node)
    for function in model.functions:
        clean(function.node)
    onnx.save(model, str(graph))


def write_case(case: Case, out_root: Path) -> None:
    out = out_root / case.name
    with tempfile.TemporaryDirectory() as tmp:
        ckpt, exported = Path(tmp) / "checkpoint", Path(tmp) / "export"
        case.checkpoint(ckpt, case.seed)
        if case.export is not None:
            case.export(ckpt, exported)
        else:
            export(ckpt, exported, case.export_flags)
        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        profiles = {}
        with builder_module() as builder:
            for folder, role in case.roles.items():
                src = exported / role.source
                if not role.graph:
                    (out / folder).mkdir()
                    for name in EXPORT_FILES:
                        if (src / name).is_file():
                            shutil.copy2(src / name, out / folder / name)
                    if (out / folder / "model.onnx").is_file():
                        strip_stack_traces(out / folder / "model.onnx")
                profiles[folder] = record_profiles(builder, ckpt / role.checkpoint, src / "model.onnx", role.builder,
                                                   spec_args(case, ckpt, role), role.component, role.amend_profiles)
        graphs = {folder: role.graph for folder, role in case.roles.items() if role.graph}
        if graphs:
            (out / "graphs.json").write_text(json.dumps(graphs, indent=2) + "\n")
        (out / "builder_config.json").write_text(
            json.dumps({folder: role.builder for folder, role in case.roles.items()}, indent=2) + "\n")
        (out / "profiles.json").write_text(json.dumps(profiles, indent=1) + "\n")
        make = case.reference or causal_reference
        arrays, meta = make(case, ckpt, out)
        np.savez_compressed(out / "reference.npz", **arrays)
        meta = {"case": case.name, "seed": case.seed, "gap": GAP, **meta}
        (out / "reference.json").write_text(json.dumps(meta, indent=1) + "\n")
    write_readme(case, out)
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    if size > case.size_limit:
        raise RuntimeError(f"{case.name}: {size} bytes, over the {case.size_limit} a case may take")
    print(f"{case.name}: {size / 1e6:.2f} MB")


def write_readme(case: Case, out: Path) -> None:
    v = versions()
    lines = [f"# Parity case `{case.name}`", "", case.summary, "",
             "Written by `scripts/make_parity_fixtures.py` (do not edit by hand):", "",
             "```bash", f"python scripts/make_parity_fixtures.py --case {case.name}", "```", "",
             f"- seed: {case.seed}",
             (f"- exporter: `{' '.join(('tensorrt-edgellm-export CKPT OUT', *case.export_flags))}`"
              if case.export is None else "- exporter: the case's own `tensorrt-edgellm-export` runs (below)")
             + f" (tensorrt-edgellm {v.get('tensorrt-edgellm', '?')})",
             "- versions: " + ", ".join(f"{k} {val}" for k, val in v.items()),
             "- files: each role folder as the exporter wrote it (`model.onnx`, `model.onnx.data`, `config.json`, "
             "the embedding); `builder_config.json` (per role, what Edge-LLM's builder adds to `config.json`); "
             "`profiles.json` (the real builder function's optimization profiles on the graph's inputs); "
             "`reference.npz` / `reference.json` (Hugging Face's fp32 logits of the compared rows, the tokens, the "
             "smallest greedy gap of each sequence)."]
    if case.notes:
        lines += ["", case.notes]
    (out / "README.md").write_text("\n".join(lines) + "\n")


def all_cases() -> dict[str, Case]:
    sys.path.insert(0, str(SCRIPTS))
    try:
        cases: dict[str, Case] = {}
        for module in sorted((SCRIPTS / "parity_cases").glob("*.py")):
            if module.name.startswith("_"):
                continue
            for case in importlib.import_module(f"parity_cases.{module.stem}").CASES:
                cases[case.name] = case
        return cases
    finally:
        sys.path.remove(str(SCRIPTS))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", action="append", help="a case to write (default: every case)")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    args = parser.parse_args(argv)
    cases = all_cases()
    if args.list:
        for name, case in cases.items():
            print(f"{name}: {case.summary}")
        return 0
    for name in args.case or list(cases):
        if name not in cases:
            parser.error(f"unknown case {name!r}; known: {', '.join(cases)}")
        write_case(cases[name], args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
