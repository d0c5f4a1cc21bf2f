"""Real TensorRT Edge-LLM 0.11 engine directories bound with ``create_from_engine_dir`` (``-m trt``), and the
same checks on the ragged toy directories (CI).

On a GPU runner with real engines (``scripts/gpu_ci.sh`` runs this when the variable is set)::

    TRTIO_EDGELLM_DIR=/engines/qwen3-0.6b:/engines/qwen3-4b-eagle3 \\
    EDGELLM_PLUGIN_PATH=/opt/edgellm/libNvInfer_edgellm_plugin.so \\
    python3 -m pytest -m trt -q -rs tests/test_edgellm_engines.py

``TRTIO_EDGELLM_DIR`` names one engine directory or several (``os.pathsep``-separated), plain (``llm.engine``
+ ``config.json``) or speculative (``spec_base.engine`` + ``base_config.json``, ``spec_draft.engine`` +
``draft_config.json``). ``EDGELLM_PLUGIN_PATH`` names Edge-LLM's plugin library, which
:func:`trtio.load_engine` loads before deserializing. ``TRTIO_EDGELLM_TREE=top_k,step,verify`` picks a
speculative pair's tree (default: :func:`default_tree`, within the configs' caps). The tests skip, saying why,
where the variable is unset or full TensorRT or a CUDA device is missing.

Without a reference model, what can be checked is checked:

* every logits row of every step is finite and not constant (plain LLM: prefill and decode; speculative pair:
  the base's rows), and the draft's rows are log-probabilities (Edge-LLM's draft log-softmaxes its logits);
* CUDA graphs change no token: the same prompts bound with ``graphs=True`` and ``graphs=False`` (graphs are
  captured and replayed);
* neither does batch composition (the second prompt alone: another KV slot, another padded width) nor
  prefilling what decoding generated (the prompts + their first tokens continue as decoding did; for a plain
  LLM also those tokens prefilled after the cached prompts, phase 2): the KV cache's pages, slots and
  positions agree between sequences and between phases;
* speculative decoding (EAGLE tree drafting, the draft's columns mapped to base tokens through
  ``d2t.safetensors``) emits the base engine's own greedy tokens. The greedy reference runs the base alone:
  a one-node verify per token (:func:`base_greedy`); CI checks it against the plain LLM's greedy tokens;
* the draft is accepted at least once (with the directory's own embedding table): verification hides a
  miswired draft, acceptance does not.

Engines in fp16 reduce in an order that depends on a step's width, so two paths may pick different tokens
where the reference barely prefers its own: a difference is accepted only at the first step where the
reference's logit of its token exceeds the other path's token's by at most ``TIE_TOL``; the rest of that
sequence is not compared. The toy directories run with a tolerance of 0 and also compare logits where the
tokens agree (``TOY_LOGITS_TOL``); on real engines only tokens are compared.

Embeddings are the directory's ``embedding.safetensors`` (:meth:`EngineDir.embedding_table`); a build that
kept its embedding in the checkpoint has none, and a fixed random table of the same shape stands in
(:func:`embedding_of`): none of the checks needs meaningful text. Prompts are seeded random token ids.

CI runs the same functions on copies of ``engines/toy-llm-ragged`` and ``engines/toy-eagle3-ragged`` (with an
``embedding.safetensors`` and a ``d2t.safetensors`` written beside the configs, and one pair whose draft has a
reduced vocabulary), with host ReferenceEngines standing in for the plans (``load_engine`` patched, the only
difference from the real path), and checks that the checks fail where they should. ``docs/edgellm-assumptions.md``
says which assumption about Edge-LLM each check covers.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _safetensors import write_safetensors

import trtio
import trtio._contracts.ragged_steps as ragged_steps_module
import trtio._setups.engine_dir as engine_dir_module
from trtio import ConfigError, EngineError, LLMEngineConfig, LLMSetup, SpecDecodeSetup
from trtio._cuda._hostmem import host_view
from trtio._ops import DecodeAdvance
from trtio._trt import PLUGIN_LIBRARY, PLUGIN_PATH_ENV
from trtio.edgellm import CONFIG_FILES, D2T_FILE, EMBEDDING_FILE, ENGINE_FILES, EngineDir
from trtio.testing import ReferenceEngine
from trtio.testing.toy_engines import RAGGED_DIRS, RAGGED_ENGINE_NAMES, RaggedToyEngines
from trtio.testing.toy_runtime import SpecStats, embed_batch, spec_generate

ENV_DIRS = "TRTIO_EDGELLM_DIR"
ENV_TREE = "TRTIO_EDGELLM_TREE"
NEW_TOKENS = 8
EXTEND = 3  # generated tokens appended to the prompts for the re-prefill check
# fp16 engines move a logit by about 1e-2 between kernel shapes; a wrong binding moves it by O(1).
TIE_TOL = 0.1
# The toys' logits agree between paths to float32 reassociation plus, rarely, a K/V element rounded to the
# neighbouring fp16 value (tests/test_setups_ragged.py); a position off by one moves them by O(0.1).
TOY_LOGITS_TOL = 2e-3
# The draft's rows are float32 log-probabilities: logsumexp is 0 to float32 rounding over a large vocabulary.
LOGSUMEXP_TOL = 1e-2
EMBED_STD = 0.02  # the random stand-in table: a typical initialisation scale


# -- what a check runs on ------------------------------------------------------------------------------


@dataclass
class Target:
    """An engine directory and how its engines are made: loaded from the plans by ``create_from_engine_dir``
    (``stand_in`` None), or stand-ins made from each role's config (CI's toy directories)."""

    path: Path
    tie_tol: float = TIE_TOL
    stand_in: Callable[[str, LLMEngineConfig], Any] | None = None
    logits_tol: float | None = None  # also compare logits where tokens agree (the toys); None: tokens only

    @property
    def directory(self) -> EngineDir:
        return EngineDir.open(self.path)

    def bind(self, *, graphs: bool) -> LLMSetup | SpecDecodeSetup:
        d = self.directory
        tree = tree_for(d) if d.kind == "spec_decode" else {}
        if self.stand_in is None:
            try:
                return trtio.create_from_engine_dir(self.path, graphs=graphs, **tree)
            except EngineError as exc:
                if not os.environ.get(PLUGIN_PATH_ENV, "").strip():
                    pytest.fail(f"{exc}\n{PLUGIN_PATH_ENV} is not set: Edge-LLM's engines need its plugin library "
                                f"({PLUGIN_LIBRARY}) loaded before they deserialize")
                raise
        configs = dict(d)
        roles = {ENGINE_FILES[role]: role for role in configs}
        stand_in = self.stand_in

        def load(path: Any, module: Any = "auto", *, plugins: Any = ()) -> Any:
            role = roles[Path(path).name]
            return stand_in(role, configs[role])

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(engine_dir_module, "load_engine", load)
            return trtio.create_from_engine_dir(self.path, graphs=graphs, **tree)


def default_tree(d: EngineDir) -> tuple[int, int, int]:
    """(draft_top_k, draft_step, verify_size): up to 3 candidates per node for up to 3 levels, and a verify
    tree of every drafted node plus the root, within the configs' caps."""
    draft_cap, verify_cap = d.draft_config.max_draft_tree_size, d.base_config.max_verify_tree_size
    top_k = min(3, draft_cap)
    step = max(1, min(3, draft_cap // top_k))
    return top_k, step, min(verify_cap, 1 + top_k * step)


def tree_for(d: EngineDir) -> dict[str, int]:
    raw = os.environ.get(ENV_TREE, "").strip()
    if raw:
        try:
            top_k, step, verify = (int(v) for v in raw.split(","))
        except ValueError:
            pytest.fail(f"{ENV_TREE}={raw!r}: expected three ints, top_k,step,verify (e.g. 3,3,10)")
    else:
        top_k, step, verify = default_tree(d)
    return {"draft_top_k": top_k, "draft_step": step, "verify_size": verify}


def model_config(d: EngineDir) -> LLMEngineConfig:
    """The plain LLM's config, or the speculative base's."""
    return d.config if d.kind == "llm" else d.base_config


def embedding_of(d: EngineDir) -> np.ndarray:
    """The directory's embedding table, or (where the build wrote none) a fixed random float16 table of
    [vocab_size, hidden_size], N(0, EMBED_STD^2). A table that is there but unreadable fails."""
    if (d.path / EMBEDDING_FILE).is_file():
        return d.embedding_table()
    cfg = model_config(d)
    rng = np.random.default_rng(0)
    table = np.empty((cfg.vocab_size, cfg.hidden_size), np.float16)
    for start in range(0, cfg.vocab_size, 8192):  # bounded float32 temporaries for a large vocabulary
        rows = min(8192, cfg.vocab_size - start)
        table[start:start + rows] = rng.standard_normal((rows, cfg.hidden_size), dtype=np.float32) * EMBED_STD
    return table


def prompts_for(d: EngineDir, embedding: np.ndarray) -> list[list[int]]:
    """Two seeded random prompts of 5 and 11 tokens (fewer where the engine takes less, leaving room for
    ``EXTEND`` more), so one is padded."""
    cfg = model_config(d)
    room = cfg.max_supported_input_length
    room = room - EXTEND if room > EXTEND else room
    lengths = [min(n, room) for n in (5, 11)][:cfg.max_supported_batch_size]
    rng = np.random.default_rng(7)
    tokens = min(cfg.vocab_size, embedding.shape[0])
    return [[int(t) for t in rng.integers(0, tokens, n)] for n in lengths]


# -- the loops ------------------------------------------------------------------------------------------


@dataclass
class Run:
    """Greedy tokens per sequence and, per step, the logits [batch, vocab] each step's token was taken from."""

    tokens: list[list[int]]
    logits: list[np.ndarray] = field(default_factory=list)

    def part(self, rows: slice = slice(None), start: int = 0) -> Run:
        """The sequences ``rows`` from step ``start`` on."""
        return Run([t[start:] for t in self.tokens[rows]], [x[rows] for x in self.logits[start:]])


def greedy(setup: LLMSetup, embedding: np.ndarray, prompts: Sequence[Sequence[int]], steps: int) -> Run:
    """Plain greedy decoding: prefill, then one decode per token."""
    act = setup.io.inputs_embeds.dtype.numpy
    setup.reset()
    emb, lens = embed_batch(embedding, prompts, act)
    run = Run([[] for _ in prompts])
    logits = setup.prefill(emb, lens).to_numpy()
    for step in range(steps):
        run.logits.append(logits)
        nxt = logits.argmax(axis=-1)
        for b, t in enumerate(nxt):
            run.tokens[b].append(int(t))
        if step + 1 < steps:
            logits = setup.decode(embedding[nxt][:, None, :].astype(act)).to_numpy()
    return run


def chunked_greedy(setup: LLMSetup, embedding: np.ndarray, prompts: Sequence[Sequence[int]],
                   chunks: Sequence[Sequence[int]], steps: int) -> Run:
    """Greedy decoding after a prompt prefilled in two chunks: ``prompts``, then ``chunks`` as a prefill that
    continues the cached prompts (``past_lengths``: Edge-LLM's phase 2, a restored prefix)."""
    act = setup.io.inputs_embeds.dtype.numpy
    setup.reset()
    emb, lens = embed_batch(embedding, prompts, act)
    setup.prefill(emb, lens)
    emb, more = embed_batch(embedding, chunks, act)
    run = Run([[] for _ in prompts])
    logits = setup.prefill(emb, more, past_lengths=lens).to_numpy()
    for step in range(steps):
        run.logits.append(logits)
        nxt = logits.argmax(axis=-1)
        for b, t in enumerate(nxt):
            run.tokens[b].append(int(t))
        if step + 1 < steps:
            logits = setup.decode(embedding[nxt][:, None, :].astype(act)).to_numpy()
    return run


def staggered_greedy(setup: LLMSetup, embedding: np.ndarray, prompts: Sequence[Sequence[int]],
                     steps: int) -> list[list[int]]:
    """Greedy decoding with sequences that come and go (Edge-LLM's slots): the first prompt starts alone in the
    last slot; the second is admitted into slot 0 two steps later while the first keeps decoding; the first
    ends (its slot released) once it has its tokens. Returns each prompt's tokens."""
    act = setup.io.inputs_embeds.dtype.numpy
    setup.reset()
    last = setup.io.max_batch - 1
    tokens: dict[int, list[int]] = {}
    where: dict[int, int] = {}  # slot -> prompt
    pending: dict[int, int] = {}  # slot -> its next token

    def admit(i: int, slot: int) -> None:
        emb, lens = embed_batch(embedding, [prompts[i]], act)
        first = int(setup.prefill(emb, lens, slots=[slot]).to_numpy()[0].argmax())
        tokens[i], where[slot], pending[slot] = [first], i, first

    admit(0, last)
    step = 0
    while where:
        if step == 2:
            admit(1, 0)
        done = [slot for slot in where if len(tokens[where[slot]]) >= steps]
        if done:
            setup.release(done)
            for slot in done:
                del where[slot], pending[slot]
        if where:
            active = sorted(where)
            logits = setup.decode(embedding[[pending[s] for s in active]][:, None, :].astype(act)).to_numpy()
            for row, slot in enumerate(active):
                pending[slot] = int(logits[row].argmax())
                tokens[where[slot]].append(pending[slot])
        step += 1
    return [tokens[0][:steps], tokens[1][:steps]]


def base_greedy(setup: SpecDecodeSetup, embedding: np.ndarray, prompts: Sequence[Sequence[int]],
                steps: int) -> Run:
    """Greedy decoding on a speculative pair's base alone: base prefill, then per token a verify of the
    one-node tree (the pending token) and its acceptance. The draft never runs."""
    act = setup.io.inputs_embeds.dtype.numpy
    setup.reset()
    emb, lens = embed_batch(embedding, prompts, act)
    run = Run([[] for _ in prompts])
    logits = setup.base_prefill(emb, lens).to_numpy()
    for step in range(steps):
        run.logits.append(logits)
        nxt = logits.argmax(axis=-1)
        for b, t in enumerate(nxt):
            run.tokens[b].append(int(t))
        if step + 1 < steps:
            logits = setup.verify(embedding[nxt][:, None, :].astype(act), [-1]).to_numpy()
            setup.accept([[0]] * len(prompts))
    return run


def draft_prefill_logits(setup: SpecDecodeSetup, embedding: np.ndarray, prompts: Sequence[Sequence[int]]) -> Any:
    """The draft's logits after the prompts ([batch, draft vocab]): base prefill, then the draft over the
    prompts shifted by one token (the base's next token appended), as a round begins."""
    act = setup.io.inputs_embeds.dtype.numpy
    setup.reset()
    emb, lens = embed_batch(embedding, prompts, act)
    first = setup.base_prefill(emb, lens).to_numpy().argmax(axis=-1)
    shifted, _ = embed_batch(embedding, [list(p[1:]) + [int(t)] for p, t in zip(prompts, first)], act)
    return setup.draft_prefill(shifted, lens).to_numpy()


# -- the checks -----------------------------------------------------------------------------------------


def assert_logits_sane(run: Run, width: int, what: str) -> None:
    """Every step's logits are [batch, width], finite, and no row is constant."""
    for i, step in enumerate(run.logits):
        assert step.shape == (len(run.tokens), width), f"{what}: step {i}: logits {step.shape}, expected " \
                                                       f"{(len(run.tokens), width)}"
        bad = ~np.isfinite(step)
        assert not bad.any(), (f"{what}: step {i}: {int(bad.sum())} logits are not finite (sequences "
                               f"{sorted({int(r) for r in np.argwhere(bad)[:, 0]})})")
        flat = np.flatnonzero(step.max(axis=1) == step.min(axis=1))
        assert flat.size == 0, f"{what}: step {i}: the logits of sequences {flat.tolist()} are constant"


def assert_log_probabilities(logits: np.ndarray, width: int, what: str) -> None:
    """Finite rows of ``width`` log-probabilities: logsumexp 0, every entry <= 0."""
    assert logits.ndim == 2 and logits.shape[1] == width, f"{what}: logits {logits.shape}, expected [*, {width}]"
    assert np.isfinite(logits).all(), f"{what}: logits are not all finite"
    x = logits.astype(np.float64)
    top = x.max(axis=1, keepdims=True)
    lse = (top + np.log(np.exp(x - top).sum(axis=1, keepdims=True)))[:, 0]
    assert np.abs(lse).max() <= LOGSUMEXP_TOL, (f"{what}: logsumexp of each row is {lse.tolist()}, not 0: the "
                                                "draft's logits are not log-softmaxed")


def assert_same_tokens(got: Sequence[Sequence[int]], reference: Run, tie_tol: float, what: str) -> None:
    """``got`` equals the reference's tokens, except from a first difference where the reference preferred its
    token over ``got``'s by at most ``tie_tol`` (a near-tie that rounding may flip)."""
    assert len(got) == len(reference.tokens), f"{what}: {len(got)} sequences, the reference has " \
                                              f"{len(reference.tokens)}"
    for b, (g, want) in enumerate(zip(got, reference.tokens)):
        assert len(g) == len(want), f"{what}: sequence {b}: {len(g)} tokens, the reference has {len(want)}"
        step = next((i for i, (x, y) in enumerate(zip(g, want)) if x != y), None)
        if step is None:
            continue
        row = reference.logits[step][b]
        margin = float(row[want[step]] - row[g[step]])
        assert margin <= tie_tol, (
            f"{what}: sequence {b} differs at step {step}: token {g[step]} where the reference chose {want[step]}, "
            f"whose logit is higher by {margin:.4g} (more than the tie tolerance {tie_tol}); tokens {list(g)} vs "
            f"the reference's {want}")


def assert_same_run(got: Run, reference: Run, target: Target, what: str) -> None:
    """:func:`assert_same_tokens`, and where ``target.logits_tol`` is set, the logits of every step before a
    sequence's first different token within it."""
    assert_same_tokens(got.tokens, reference, target.tie_tol, what)
    if target.logits_tol is None:
        return
    for b, (g, want) in enumerate(zip(got.tokens, reference.tokens)):
        same = next((i for i, (x, y) in enumerate(zip(g, want)) if x != y), len(g))
        for step in range(same):
            diff = float(np.abs(got.logits[step][b] - reference.logits[step][b]).max())
            assert diff <= target.logits_tol, (f"{what}: sequence {b}, step {step}: logits differ by {diff:.4g} "
                                               f"(more than {target.logits_tol}) with the same tokens")


def graph_use(stats: Any) -> tuple[int, int]:
    """(captures, hits) of a setup's graph stats (one GraphStats, or one per engine)."""
    items = stats.values() if isinstance(stats, dict) else [stats]
    return sum(s.captures for s in items), sum(s.hits for s in items)


@dataclass
class Results:
    """Everything the checks look at for one directory, from two bindings (graphs off, then on)."""

    kind: str
    width: int  # the logits width of the plain LLM / the base
    draft_width: int
    reference: Run  # greedy tokens: the plain LLM, or the base alone (graphs off)
    graphed: list[list[int]]  # plain: greedy with graphs; pair: speculative decoding with graphs
    graph_captures: int
    graph_hits: int
    spec: list[list[int]] | None = None  # speculative decoding with graphs off
    spec_stats: SpecStats | None = None
    draft_logits: np.ndarray | None = None
    graphed_repeat: list[list[int]] | None = None  # plain: greedy with graphs again after reset()
    alone: Run | None = None  # the reference loop on the second prompt alone (slot 0, its own width)
    extended: Run | None = None  # the reference loop on each prompt + its first EXTEND greedy tokens
    chunked: Run | None = None  # plain: the same, the EXTEND tokens prefilled after the cached prompt
    staggered: list[list[int]] | None = None  # plain: the first two prompts admitted at different steps (slots)
    own_embedding: bool = True  # the directory's embedding.safetensors (not the random stand-in)


def run_checks_on(target: Target, steps: int = NEW_TOKENS) -> Results:
    """Bind ``target`` twice (graphs off, graphs on) and run every loop the checks need."""
    d = target.directory
    embedding = embedding_of(d)
    prompts = prompts_for(d, embedding)
    cfg = model_config(d)
    if cfg.output_vocab_size != cfg.vocab_size:
        pytest.skip(f"{d.path}: a reduced-vocabulary engine (reduced_vocab_size {cfg.output_vocab_size}): its logits "
                    "need vocab_map.safetensors, which these checks do not read")
    def variants(setup: Any, loop: Callable[..., Run], reference: Run) -> dict[str, Run | None]:
        """The reference loop again on the second prompt alone, and on the prompts extended by their first
        generated tokens (where the engine takes them)."""
        extended = [list(p) + t[:EXTEND] for p, t in zip(prompts, reference.tokens)]
        fits = steps > EXTEND and max(len(p) for p in extended) <= cfg.max_supported_input_length
        return {"alone": loop(setup, embedding, prompts[1:], steps) if len(prompts) > 1 else None,
                "extended": loop(setup, embedding, extended, steps - EXTEND) if fits else None}

    if d.kind == "llm":
        with target.bind(graphs=False) as setup:
            reference = greedy(setup, embedding, prompts, steps)
            more = variants(setup, greedy, reference)
            if more["extended"] is not None:
                more["chunked"] = chunked_greedy(setup, embedding, prompts, [t[:EXTEND] for t in reference.tokens],
                                                 steps - EXTEND)
        with target.bind(graphs=True) as setup:
            graphed = greedy(setup, embedding, prompts, steps).tokens
            repeat = greedy(setup, embedding, prompts, steps).tokens
            staggered = staggered_greedy(setup, embedding, prompts, steps) \
                if len(prompts) > 1 and setup.io.max_batch > 1 else None
            captures, hits = graph_use(setup.graph_stats)
        return Results("llm", cfg.output_vocab_size, 0, reference, graphed, captures, hits, graphed_repeat=repeat,
                       staggered=staggered, **more)
    d2t = d.draft_to_target()
    with target.bind(graphs=False) as setup:
        reference = base_greedy(setup, embedding, prompts, steps)
        more = variants(setup, base_greedy, reference)
        draft_logits = draft_prefill_logits(setup, embedding, prompts)
        spec, stats = spec_generate(setup, embedding, prompts, steps, draft_to_target=d2t)
    with target.bind(graphs=True) as setup:
        graphed, _ = spec_generate(setup, embedding, prompts, steps, draft_to_target=d2t)
        captures, hits = graph_use(setup.graph_stats)
    return Results("spec_decode", cfg.output_vocab_size, d.draft_config.output_vocab_size, reference, graphed,
                   captures, hits, spec=spec, spec_stats=stats, draft_logits=draft_logits,
                   own_embedding=(d.path / EMBEDDING_FILE).is_file(), **more)


# -- targets: real directories (trt) and the toy directories (CI) ---------------------------------------


def _real_dirs() -> list[Any]:
    raw = os.environ.get(ENV_DIRS, "").strip()
    if not raw:
        return [pytest.param(None, marks=pytest.mark.trt, id=f"{ENV_DIRS}-unset")]
    return [pytest.param(Path(p), marks=pytest.mark.trt, id=Path(p).name or p)
            for p in raw.split(os.pathsep) if p.strip()]


def _kind_on_disk(path: Path | None) -> str:
    """"spec_decode" where the folder holds a base config, "llm" otherwise (EngineDir.open says what is
    wrong with a folder that is neither; the test reports it)."""
    return "spec_decode" if path is not None and (path / CONFIG_FILES["base"]).is_file() else "llm"


TOY_TARGETS = ["toy-llm-ragged", "toy-eagle3-ragged", "toy-eagle3-ragged-d2t"]
REAL = _real_dirs()
ALL = [*REAL, *TOY_TARGETS]
SPEC = [p for p in REAL if p.values[0] is None or _kind_on_disk(p.values[0]) == "spec_decode"] + TOY_TARGETS[1:]
LLM = [p for p in REAL if p.values[0] is None or _kind_on_disk(p.values[0]) == "llm"] + TOY_TARGETS[:1]


@pytest.fixture(scope="module")
def toys() -> RaggedToyEngines:
    return RaggedToyEngines.load()


def _copy_toy(toys: RaggedToyEngines, name: str, out: Path) -> Path:
    """A copy of a ragged toy directory with the files a real build writes beside the configs: the
    embedding table, and for the pair a d2t map (direct ids: the identity)."""
    path = out / name
    shutil.copytree(toys.root / name, path)
    write_safetensors(path / EMBEDDING_FILE, {"embedding": toys.embedding().astype(np.float16)})
    if name == RAGGED_DIRS[1]:
        vocab = toys.llm_config.vocab_size
        write_safetensors(path / D2T_FILE, {"d2t": np.arange(vocab, dtype=np.int32)})
    return path


def reduced_draft_pair(toys: RaggedToyEngines, out: Path, *, draft_vocab: int = 256) -> tuple[Path, np.ndarray]:
    """The toy pair with a reduced-vocabulary draft, as an EAGLE3 export makes one: ``draft_vocab_size`` columns,
    column i predicting base token ``targets[i]`` (a seeded random subset, in random order), and
    ``d2t.safetensors`` holding offsets (``targets[i] - i``; some negative, so not a table of direct ids).
    Returns the directory and ``targets``."""
    path = _copy_toy(toys, RAGGED_DIRS[1], out)
    vocab = toys.llm_config.vocab_size
    targets = np.random.default_rng(3).choice(vocab, draft_vocab, replace=False).astype(np.int64)
    file = path / CONFIG_FILES["draft"]
    raw = file.read_text()
    assert f'"draft_vocab_size": {vocab}' in raw
    file.write_text(raw.replace(f'"draft_vocab_size": {vocab}', f'"draft_vocab_size": {draft_vocab}'))
    offsets = (targets - np.arange(draft_vocab)).astype(np.int32)
    assert (offsets < 0).any()
    write_safetensors(path / D2T_FILE, {"d2t": offsets})
    return path, targets


def toy_stand_in(toys: RaggedToyEngines, draft_columns: np.ndarray | None = None) -> Callable[[str, Any], Any]:
    """Host ReferenceEngines for a toy directory's roles (the toys' seeded weights); a reduced draft's
    output columns are the base's LM-head columns of ``draft_columns``."""
    names = {"llm": RAGGED_ENGINE_NAMES[0], "base": RAGGED_ENGINE_NAMES[1], "draft": RAGGED_ENGINE_NAMES[2]}

    def make(role: str, cfg: LLMEngineConfig) -> Any:
        weights = toys.weights(names[role])
        if role == "draft" and draft_columns is not None:
            weights = dataclasses.replace(weights, w_lm=toys.weights(names["base"]).w_lm[:, draft_columns])
        return ReferenceEngine.from_config(cfg, weights=weights, device="host")

    return make


@pytest.fixture(scope="module")
def target(request: pytest.FixtureRequest, toys: RaggedToyEngines,
           tmp_path_factory: pytest.TempPathFactory) -> Target:
    param = request.param
    if isinstance(param, Path):
        return Target(param)
    if param is None:
        pytest.skip(f"{ENV_DIRS} is not set: name a real Edge-LLM 0.11 engine directory (plain or speculative; "
                    f"several separated by {os.pathsep!r}) and set {PLUGIN_PATH_ENV} to its {PLUGIN_LIBRARY}")
    out = tmp_path_factory.mktemp(param)
    if param == "toy-eagle3-ragged-d2t":
        path, targets = reduced_draft_pair(toys, out)
        return Target(path, tie_tol=0.0, stand_in=toy_stand_in(toys, targets), logits_tol=TOY_LOGITS_TOL)
    return Target(_copy_toy(toys, param, out), tie_tol=0.0, stand_in=toy_stand_in(toys), logits_tol=TOY_LOGITS_TOL)


@pytest.fixture(scope="module")
def results(target: Target) -> Results:
    return run_checks_on(target)


# -- the tests --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("target", ALL, indirect=True)
def test_logits_are_finite_and_not_constant(target: Target, results: Results) -> None:
    what = "greedy decoding" if results.kind == "llm" else "the base's greedy decoding (one-node verify)"
    assert_logits_sane(results.reference, results.width, f"{target.path.name}: {what}")


@pytest.mark.parametrize("target", ALL, indirect=True)
def test_graphs_change_no_token(target: Target, results: Results) -> None:
    name = target.path.name
    assert results.graph_captures >= 1 and results.graph_hits >= 1, (
        f"{name}: graphs=True captured {results.graph_captures} and replayed {results.graph_hits} graphs")
    what = "greedy decoding" if results.kind == "llm" else "speculative decoding"
    assert_same_tokens(results.graphed, results.reference, target.tie_tol, f"{name}: {what} with CUDA graphs")
    if results.graphed_repeat is not None:
        assert results.graphed_repeat == results.graphed, f"{name}: after reset() the graphed run gave other tokens"


@pytest.mark.parametrize("target", ALL, indirect=True)
def test_batch_composition_changes_no_token(target: Target, results: Results) -> None:
    """The second prompt alone (sequence slot 0, its own padded width) gives the tokens it gave as the batch's
    second sequence (slot 1): its pages, entry-padded rows and logits row do not depend on its neighbours."""
    if results.alone is None:
        pytest.skip(f"{target.path}: the engine takes one sequence per step")
    assert_same_run(results.alone, results.reference.part(slice(1, None)), target,
                    f"{target.path.name}: the second prompt alone")


@pytest.mark.parametrize("target", ALL, indirect=True)
def test_prefilling_generated_tokens_changes_no_token(target: Target, results: Results) -> None:
    """Each prompt extended by its first EXTEND generated tokens and prefilled continues with the tokens
    decoding gave: what decode steps write to the KV cache (slots, positions, RoPE) is what a prefill
    writes."""
    if results.extended is None:
        pytest.skip(f"{target.path}: max_input_len leaves no room for {EXTEND} more prompt tokens")
    assert_same_run(results.extended, results.reference.part(start=EXTEND), target,
                    f"{target.path.name}: the prompts + their first {EXTEND} tokens, prefilled")


@pytest.mark.parametrize("target", LLM, indirect=True)
def test_prefill_after_a_cached_prefix_changes_no_token(target: Target, results: Results) -> None:
    """The same EXTEND tokens prefilled after the cached prompts (``prefill(past_lengths=...)``, phase 2) continue
    as decoding did: a restored prefix is read as the prompt's own prefill wrote it."""
    if results.kind != "llm":
        pytest.skip(f"{target.path}: a speculative pair's base prefill starts from an empty cache")
    if results.chunked is None:
        pytest.skip(f"{target.path}: max_input_len leaves no room for {EXTEND} more prompt tokens")
    assert_same_run(results.chunked, results.reference.part(start=EXTEND), target,
                    f"{target.path.name}: {EXTEND} tokens prefilled after the cached prompts")


@pytest.mark.parametrize("target", LLM, indirect=True)
def test_sequences_admitted_at_different_steps_change_no_token(target: Target, results: Results) -> None:
    """Sequences admitted into other slots while one decodes, and released when done, give the tokens of the
    whole-batch run: each step binds its sequences' page-table rows in step order, and their pages are their
    own (docs/edgellm-assumptions.md 3.6, 4.2)."""
    if results.kind != "llm":
        pytest.skip(f"{target.path}: the speculative pair's slots are checked in tests/test_sequences.py")
    if results.staggered is None:
        pytest.skip(f"{target.path}: the engine takes one sequence per step")
    assert_same_tokens(results.staggered, results.reference.part(slice(0, 2)), target.tie_tol,
                       f"{target.path.name}: two prompts admitted at different steps")


@pytest.mark.parametrize("target", SPEC, indirect=True)
def test_spec_decode_emits_the_base_greedy_tokens(target: Target, results: Results) -> None:
    if results.kind != "spec_decode":
        pytest.skip(f"{target.path}: a plain LLM directory has no draft")
    assert results.spec is not None and results.spec_stats is not None
    assert results.spec_stats.rounds >= 1 and results.spec_stats.proposed > 0
    assert_same_tokens(results.spec, results.reference, target.tie_tol,
                       f"{target.path.name}: speculative decoding")


@pytest.mark.parametrize("target", SPEC, indirect=True)
def test_draft_logits_are_log_probabilities(target: Target, results: Results) -> None:
    if results.kind != "spec_decode":
        pytest.skip(f"{target.path}: a plain LLM directory has no draft")
    assert results.draft_logits is not None
    assert_log_probabilities(results.draft_logits, results.draft_width, f"{target.path.name}: the draft prefill")


@pytest.mark.parametrize("target", SPEC, indirect=True)
def test_the_draft_is_accepted_sometimes(target: Target, results: Results) -> None:
    """Verification keeps the tokens right whatever the draft proposes, so only acceptance shows that the draft
    is fed as it was trained: the base's hidden states of the right rows and layers, the shared embedding table,
    d2t. A real EAGLE3 draft on its own embedding table agrees with its base on some of these tokens."""
    if results.kind != "spec_decode":
        pytest.skip(f"{target.path}: a plain LLM directory has no draft")
    if not results.own_embedding:
        pytest.skip(f"{target.path}: no {EMBEDDING_FILE}; a draft fed the random stand-in table is not expected to "
                    "agree with its base")
    stats = results.spec_stats
    assert stats is not None
    assert stats.accepted > 0, (
        f"{target.path.name}: none of the {stats.proposed} drafted tokens of {stats.rounds} rounds was accepted: "
        "check the draft's inputs (hidden_states_input rows and eagle_hidden_state_layers, d2t.safetensors, the "
        "embedding table) before trusting its speed-up (docs/edgellm-assumptions.md)")


# -- CI only: the reference and the checks themselves ---------------------------------------------------


def test_base_greedy_is_the_plain_llms_greedy(toys: RaggedToyEngines, tmp_path: Path) -> None:
    """The reference the speculative check trusts: the toy pair's base alone (one-node verify steps) gives the
    plain toy LLM's greedy tokens (same weights), logits within float32 reassociation."""
    llm = Target(_copy_toy(toys, RAGGED_DIRS[0], tmp_path), tie_tol=0.0, stand_in=toy_stand_in(toys))
    pair = Target(_copy_toy(toys, RAGGED_DIRS[1], tmp_path), tie_tol=0.0, stand_in=toy_stand_in(toys))
    embedding = embedding_of(llm.directory)
    prompts = prompts_for(llm.directory, embedding)
    with llm.bind(graphs=False) as setup:
        plain = greedy(setup, embedding, prompts, 12)
    with pair.bind(graphs=False) as setup:
        base = base_greedy(setup, embedding, prompts, 12)
    assert base.tokens == plain.tokens
    for a, b in zip(base.logits, plain.logits):
        np.testing.assert_allclose(a, b, atol=2e-3, rtol=0)


def test_reduced_draft_vocabulary_goes_through_d2t(toys: RaggedToyEngines, tmp_path: Path) -> None:
    """A draft with 256 of the 512 tokens (d2t as offsets): the tree holds base tokens, so speculation keeps
    the base's tokens and is accepted; read without the map it keeps the tokens (verify decides) but its
    guesses name the wrong tokens and are accepted less."""
    path, targets = reduced_draft_pair(toys, tmp_path)
    d = EngineDir.open(path)
    assert d.draft_config.output_vocab_size == 256
    assert d.draft_to_target().tolist() == targets.tolist(), "read as offsets"
    target = Target(path, tie_tol=0.0, stand_in=toy_stand_in(toys, targets))
    embedding = embedding_of(d)
    prompts = prompts_for(d, embedding)
    with target.bind(graphs=False) as setup:
        reference = base_greedy(setup, embedding, prompts, 24)
        mapped, with_map = spec_generate(setup, embedding, prompts, 24, draft_to_target=d.draft_to_target())
        unmapped, without = spec_generate(setup, embedding, prompts, 24)
    assert mapped == reference.tokens and unmapped == reference.tokens
    assert with_map.accepted > without.accepted, (with_map, without)

    # The same pair without its d2t.safetensors (the identity map): the checks keep the tokens, and the
    # acceptance check is the one that notices.
    (path / D2T_FILE).unlink()
    results = run_checks_on(target)
    assert results.spec == results.reference.tokens
    with pytest.raises(AssertionError, match=r"none of the \d+ drafted tokens of \d+ rounds was accepted"):
        test_the_draft_is_accepted_sometimes(target, results)


def test_checks_fail_on_nan_logits_and_on_a_real_divergence(toys: RaggedToyEngines, tmp_path: Path) -> None:
    # A NaN in the embedding of a prompt token makes its sequence's logits NaN: the sanity check names it.
    path = _copy_toy(toys, RAGGED_DIRS[0], tmp_path)
    d = EngineDir.open(path)
    embedding = np.array(d.embedding_table())
    prompts = prompts_for(d, embedding)
    embedding[prompts[1][-1]] = np.nan
    target = Target(path, tie_tol=0.0, stand_in=toy_stand_in(toys))
    with target.bind(graphs=False) as setup:
        run = greedy(setup, embedding, prompts, 2)
    with pytest.raises(AssertionError, match=r"toy: step 0: \d+ logits are not finite \(sequences \[1\]\)"):
        assert_logits_sane(run, d.config.output_vocab_size, "toy")

    # Tokens that differ where the reference had a clear preference fail; a near-tie within tolerance passes.
    logits = np.zeros((2, 1, 4), np.float32)
    logits[0, 0] = [0.0, 3.0, 2.95, 0.0]  # step 0: token 1, token 2 close behind
    logits[1, 0] = [5.0, 0.0, 0.0, 0.0]  # step 1: token 0, clearly
    reference = Run([[1, 0]], list(logits))
    assert_same_tokens([[1, 0]], reference, 0.0, "same")
    assert_same_tokens([[2, 3]], reference, 0.1, "a near-tie at step 0")
    with pytest.raises(AssertionError, match=r"x: sequence 0 differs at step 0: token 2 where the reference chose 1, "
                                             r"whose logit is higher by 0.05"):
        assert_same_tokens([[2, 3]], reference, 0.01, "x")
    with pytest.raises(AssertionError, match=r"differs at step 1: token 3 where the reference chose 0, whose logit "
                                             r"is higher by 5"):
        assert_same_tokens([[1, 3]], reference, 0.1, "x")
    with pytest.raises(AssertionError, match=r"not log-softmaxed"):
        assert_log_probabilities(np.zeros((1, 4), np.float32), 4, "x")
    assert_log_probabilities(np.log(np.full((1, 4), 0.25, np.float32)), 4, "x")


def test_a_real_directory_that_fails_to_load_names_the_plugin_variable(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Without TensorRT here the load fails; without EDGELLM_PLUGIN_PATH the failure says to set it."""
    path = tmp_path / "llm"
    shutil.copytree(RaggedToyEngines.load().root / RAGGED_DIRS[0], path)
    monkeypatch.delenv(PLUGIN_PATH_ENV, raising=False)

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise EngineError("plan file 'llm.engine' could not be deserialized (no plugin creator)")

    monkeypatch.setattr(engine_dir_module, "load_engine", refuse)
    with pytest.raises(pytest.fail.Exception, match=rf"{PLUGIN_PATH_ENV} is not set: Edge-LLM's engines need its "
                                                    rf"plugin library \({PLUGIN_LIBRARY}\)"):
        Target(path).bind(graphs=False)
    monkeypatch.setenv(PLUGIN_PATH_ENV, str(tmp_path / PLUGIN_LIBRARY))
    with pytest.raises(EngineError, match="no plugin creator"):
        Target(path).bind(graphs=False)


def test_tree_comes_from_the_caps_or_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    d = RaggedToyEngines.load().pair_dir
    monkeypatch.delenv(ENV_TREE, raising=False)
    assert default_tree(d) == (3, 2, 7)  # caps: 8 draft nodes, 8 verify nodes
    assert tree_for(d) == {"draft_top_k": 3, "draft_step": 2, "verify_size": 7}
    monkeypatch.setenv(ENV_TREE, "2,3,8")
    assert tree_for(d) == {"draft_top_k": 2, "draft_step": 3, "verify_size": 8}
    monkeypatch.setenv(ENV_TREE, "2,3")
    with pytest.raises(pytest.fail.Exception, match=r"expected three ints, top_k,step,verify"):
        tree_for(d)


def test_random_embedding_stands_in_where_the_build_wrote_none(toys: RaggedToyEngines, tmp_path: Path) -> None:
    bare = tmp_path / "bare"
    shutil.copytree(toys.root / RAGGED_DIRS[0], bare, ignore=shutil.ignore_patterns(EMBEDDING_FILE))
    d = EngineDir.open(bare)  # the configs alone: no embedding.safetensors
    table = embedding_of(d)
    assert table.shape == (512, 64) and table.dtype == np.float16
    assert np.array_equal(table, embedding_of(d)), "seeded: the same table every time"
    assert 0.015 < float(table.astype(np.float32).std()) < 0.025
    broken = _copy_toy(toys, RAGGED_DIRS[0], tmp_path)
    (broken / EMBEDDING_FILE).write_bytes(b"\x00" * 4)
    with pytest.raises(ConfigError, match="shorter than its 8-byte header length"):
        embedding_of(EngineDir.open(broken))


class _SharedPages(Target):
    """A toy directory bound with every step's page-table rows pointing at its first sequence's pages."""

    def bind(self, *, graphs: bool) -> LLMSetup | SpecDecodeSetup:
        setup = super().bind(graphs=graphs)
        assert isinstance(setup, LLMSetup) and setup.state.page_table is not None
        table = setup._seqs.tables["llm"]
        real = table.step_rows

        def shared(slots: tuple[int, ...]) -> np.ndarray:
            rows = real(slots).copy()
            rows[:] = rows[0]
            rows.flags.writeable = False
            return rows

        table.step_rows = shared  # type: ignore[method-assign]
        return setup


@dataclass(frozen=True)
class _DecodeOnePositionAhead(DecodeAdvance):
    """A decode step whose tokens sit one position past their slot (positions and RoPE rows shifted)."""

    def enqueue(self, stream: Any) -> None:
        super().enqueue(stream)
        ptr, b = self.positions.data_ptr, self.batch

        def shift() -> None:
            host_view(ptr, 4 * b).view(np.int32)[:] += 1

        stream.backend.launch_host_func(stream.handle, shift)


def test_consistency_checks_catch_shared_pages_and_a_shifted_decode_position(
        toys: RaggedToyEngines, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Bugs that leave every token check self-consistent: sequences sharing KV pages change tokens with the
    batch; decode steps at the wrong RoPE position change them against a prefill of the same tokens."""
    path = _copy_toy(toys, RAGGED_DIRS[0], tmp_path)
    toy = Target(path, tie_tol=0.0, stand_in=toy_stand_in(toys), logits_tol=TOY_LOGITS_TOL)
    shared = run_checks_on(_SharedPages(path, tie_tol=0.0, stand_in=toy_stand_in(toys)))
    test_logits_are_finite_and_not_constant(toy, shared)
    with pytest.raises(AssertionError, match=r"the second prompt alone: sequence 0 differs at step \d"):
        test_batch_composition_changes_no_token(toy, shared)

    # One position ahead changes no token of these 8 (the toy's attention is weak), only logits: the toys
    # compare those too; real engines, with tokens only, see a larger shift.
    monkeypatch.setattr(ragged_steps_module, "DecodeAdvance", _DecodeOnePositionAhead)
    shifted = run_checks_on(toy)
    test_graphs_change_no_token(toy, shifted)
    test_batch_composition_changes_no_token(toy, shifted)
    test_prefilling_generated_tokens_changes_no_token(Target(path, tie_tol=0.0), shifted)
    with pytest.raises(AssertionError, match=r"the prompts \+ their first 3 tokens, prefilled: sequence 0, step 0: "
                                             r"logits differ by 0\.\d+ \(more than 0.002\) with the same tokens"):
        test_prefilling_generated_tokens_changes_no_token(toy, shifted)
