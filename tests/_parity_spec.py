"""Real-graph parity of speculative pairs (DESIGN §17): rounds of a :class:`trtio.SpecDecodeSetup` bound to NVIDIA's
exported base and draft graphs (:class:`trtio.testing.OnnxEngine`), held to the case's references.

A round: a proposer gives each sequence's verify tree (node 0 the pending token: the base's last greedy token,
not yet cached), ``verify`` runs the base over it, every node whose path the reference knows is compared (the
accepted nodes must all be known: the true continuation is), the longest path whose every node is its parent's
greedy token is accepted and its tokens and bonus token held to Hugging Face's greedy tokens, ``accept`` commits
it and a catch-up (the draft's ``draft_accept``, compared where the case has draft references) ends the round.
The proposers: :func:`replayed_trees` (the case's own trees, "drafts made elsewhere", optionally proposed through
the draft as well) and :func:`draft_chains` (the draft's top-k chains, as ``trtio generate`` drafts). Generic over
the pair: a family (MTP, DFlash) brings its own proposer and catch-up.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import trtio
from tests._parity import Case, Compare, ParityMismatch, Seq, _embeds

Hook = Callable[[dict[str, np.ndarray]], None]


class SpecCase(Case):
    """A speculative pair's fixture: the base's rows (as :class:`Case`), the verify-node rows off the true
    continuation (``path_keys_i``: committed length, then the node's path from node 0, -1 padded), the draft's
    committed rows (``draft_logits_i`` at ``positions_i``) and draft-tree nodes (``draft_path_keys_i``), and the
    replayed trees (``tree_tokens_i``, ``tree_parents_i``, ``tree_commits_i``)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.spec = self.meta["spec"]
        self.nodes: list[dict[tuple[int, ...], np.ndarray]] = []
        self.draft_nodes: list[dict[tuple[int, ...], np.ndarray]] = []
        self.draft_rows: list[dict[int, np.ndarray]] = []
        for s in self.seqs:
            a = self.arrays
            self.nodes.append(_keyed(a.get(f"path_keys_{s.index}"), a.get(f"path_logits_{s.index}")))
            self.draft_nodes.append(_keyed(a.get(f"draft_path_keys_{s.index}"), a.get(f"draft_path_logits_{s.index}")))
            rows = a.get(f"draft_logits_{s.index}")
            self.draft_rows.append({} if rows is None else
                                   {int(p): r for p, r in zip(a[f"positions_{s.index}"], rows)})

    def base_row(self, seq: Seq, committed: int, path: list[int]) -> np.ndarray | None:
        """Hugging Face's logits at a verify node: the ``committed`` tokens, then ``path`` (node 0 to the node)."""
        n = len(path)
        if path == seq.tokens[committed:committed + n].tolist():
            return seq.rows.get(committed + n - 1)
        return self.nodes[seq.index].get((committed, *path))

    def draft_node(self, seq: Seq, committed: int, path: list[int]) -> np.ndarray | None:
        """The draft's reference logits at a draft-tree node (``path``: its tokens from the first level)."""
        return self.draft_nodes[seq.index].get((committed, *path))


def _keyed(keys: np.ndarray | None, rows: np.ndarray | None) -> dict[tuple[int, ...], np.ndarray]:
    if keys is None or rows is None:
        return {}
    return {tuple(int(v) for v in k if v >= 0): r for k, r in zip(keys, rows)}


@dataclass
class SpecCompare:
    """The base's and the draft's comparisons of one run."""

    base: Compare = field(default_factory=Compare)
    draft: Compare = field(default_factory=Compare)
    accepted: list[int] = field(default_factory=list)  # accepted path lengths, every round and sequence

    @property
    def worst(self) -> float:
        return max(self.base.worst, self.draft.worst)


@dataclass
class State:
    """Where each sequence stands between rounds."""

    seqs: list[Seq]  # in the setup's batch order (its active slots, ascending)
    committed: list[int]  # tokens the base has cached
    root: np.ndarray | None = None  # the draft's logits at each sequence's last committed row (its tree's root)
    round: int = 0  # rounds run
    done: list[int] = field(default_factory=list)  # rounds each sequence has been through

    def __post_init__(self) -> None:
        self.done = self.done or [0] * len(self.seqs)


@dataclass
class Tree:
    """A round's verify trees: per sequence the node tokens (node 0 the pending token) and parents (-1 for
    node 0)."""

    tokens: list[list[int]]
    parents: list[list[int]]
    real: list[int] | None = None  # nodes kept per sequence (the rest padding rows); None: all

    def verify_tree(self) -> Any:
        """What ``verify`` takes: the parent lists, or (some sequence padded) the unpacked masks [b, N, N]."""
        n = len(self.tokens[0])
        if self.real is None or min(self.real) == n:
            return [list(p) for p in self.parents]
        vis = np.zeros((len(self.tokens), n, n), bool)
        for i, (par, m) in enumerate(zip(self.parents, self.real)):
            for node in range(m):
                up = node
                while up >= 0:
                    vis[i, node, up] = True
                    up = par[up]
        return vis

    def size(self, i: int) -> int:
        return len(self.tokens[i]) if self.real is None else self.real[i]


Proposer = Callable[[Any, SpecCase, State, SpecCompare], Tree]


# -- the setup -------------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def spec_setup(case: SpecCase, backend: str = "host", graphs: bool = False,
               hooks: dict[str, Hook] | None = None) -> Iterator[tuple[Any, np.ndarray]]:
    """The pair bound with :func:`trtio.create_for_spec_decode`; its bundle made as
    :meth:`trtio.EngineDir.deployment` makes it from an engine directory holding the two engines' configs (and
    the draft's ``d2t.safetensors``). Yields the setup and the draft-to-target map trtio reads from that directory."""
    base, draft = case.engine("base", backend), case.engine("draft", backend)
    base.input_hook = (hooks or {}).get("base")
    draft.input_hook = (hooks or {}).get("draft")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "base_config.json").write_text(json.dumps(base.config))
        (root / "draft_config.json").write_text(json.dumps(draft.config))
        if (case.root / "draft" / "d2t.safetensors").is_file():
            shutil.copy2(case.root / "draft" / "d2t.safetensors", root / "d2t.safetensors")
        directory = trtio.EngineDir.open(root)
        spec = case.spec
        bundle = directory.deployment(spec["draft_top_k"], spec["draft_step"], spec["verify_size"])
        d2t = directory.draft_to_target()
    with trtio.create_for_spec_decode(base, draft, bundle, backend=backend, graphs=graphs) as setup:
        yield setup, d2t


# -- rounds ----------------------------------------------------------------------------------------------------------


def _greedy_path(tokens: list[int], parents: list[int], greedy: np.ndarray) -> list[int]:
    """The longest root path whose every node is its parent's greedy token."""
    ok = [True] + [False] * (len(tokens) - 1)
    for node in range(1, len(tokens)):  # parents come before their children
        p = parents[node]
        ok[node] = ok[p] and tokens[node] == int(greedy[p])
    depth = [0] * len(tokens)
    for node in range(1, len(tokens)):
        depth[node] = depth[parents[node]] + 1
    best = max((n for n in range(len(tokens)) if ok[n]), key=lambda n: (depth[n], -n))
    path = [best]
    while path[-1] != 0:
        path.append(parents[path[-1]])
    return path[::-1]


def _node_path(tokens: list[int], parents: list[int], node: int) -> list[int]:
    out = []
    while node >= 0:
        out.append(tokens[node])
        node = parents[node]
    return out[::-1]


def prefill(setup: Any, case: SpecCase, cmp: SpecCompare, *, draft: bool = True,
            family: DraftFamily | None = None) -> State:
    """The base's prefill of the case's prompts (compared, greedy tokens held to Hugging Face's), then, with
    ``draft``, the draft's prefill (``family``'s: EAGLE3's and MTP's over the prompts shifted by one token, the
    pending token last), its root logits compared with the draft's reference."""
    table, seqs = case.table("base"), case.of("spec")
    x, lens = _embeds(table, [s.prompt for s in seqs])
    logits = setup.base_prefill(x, lens).to_numpy()
    for i, s in enumerate(seqs):
        cmp.base.row(s, s.prompt_length - 1, logits[i], "base prefill")
        cmp.base.token(s, s.prompt_length - 1, int(logits[i].argmax()), "base prefill")
    state = State(seqs, [s.prompt_length for s in seqs])
    if draft:
        (family or EAGLE).draft_prefill(setup, case, cmp, state, list(range(len(seqs))), None)
    return state


def _draft_rows(case: SpecCase, cmp: SpecCompare, state: State, what: str, which: list[int] | None = None) -> None:
    assert state.root is not None
    for i in range(len(state.seqs)) if which is None else which:
        s = state.seqs[i]
        row = state.committed[i] - 1
        want = case.draft_rows[s.index].get(row)
        if want is not None:
            cmp.draft.values(want, state.root[i], f"sequence {s.index} draft row {row} ({what})")


def _eagle_prefill(setup: Any, case: SpecCase, cmp: SpecCompare, state: State, which: list[int],
                   slots: list[int] | None) -> None:
    """EAGLE3's / MTP's draft prefill of sequences ``which`` of ``state`` (in ``slots``, or the whole batch): the
    prompt shifted by one token, ``hidden_states_input`` the base prefill's rows; the roots compared."""
    seqs = [state.seqs[i] for i in which]
    x, lens = _embeds(case.table("base"), [s.tokens[1:s.prompt_length + 1] for s in seqs])
    root = setup.draft_prefill(x, lens, slots=slots).to_numpy()
    if state.root is None:
        state.root = root.copy()
    else:
        state.root[which] = root
    _draft_rows(case, cmp, state, "draft prefill" if slots is None else "admitted draft prefill", which)


def _eagle_catch_up(setup: Any, case: SpecCase, cmp: SpecCompare, state: State, lens: list[int]) -> None:
    """EAGLE3's / MTP's catch-up after an accept of ``lens`` tokens (``state.committed`` not yet moved): the accepted
    tokens shifted by one, the accepted nodes' base rows as features; the new roots compared."""
    rows = [s.tokens[c + 1:c + 1 + n] for s, c, n in zip(state.seqs, state.committed, lens)]
    x, _ = _embeds(case.table("base"), rows)
    state.root = setup.draft_accept(x, lens).to_numpy().copy()
    moved = State(state.seqs, [c + n for c, n in zip(state.committed, lens)], state.root)
    _draft_rows(case, cmp, moved, f"round {state.round} catch-up")


@dataclass(frozen=True)
class DraftFamily:
    """How a pair's draft takes part in the rounds: its prefill (sequences ``which`` of the state, in ``slots`` or
    the whole batch), its catch-up after an accept, the proposer of its own drafts (given the draft-to-target map)
    and whether it proposes trees level by level (``draft_propose``; a block draft does not)."""

    draft_prefill: Callable[[Any, SpecCase, SpecCompare, State, list[int], list[int] | None], None]
    catch_up: Callable[[Any, SpecCase, SpecCompare, State, list[int]], None]
    own_drafts: Callable[[np.ndarray], Proposer]
    proposes: bool = True


AcceptHook = Callable[[list[list[int]], Tree], list[list[int]]]


def rounds(setup: Any, case: SpecCase, cmp: SpecCompare, state: State, propose: Proposer, count: int, *,
           catch_up: bool = True, accept_hook: AcceptHook | None = None, family: DraftFamily | None = None) -> None:
    """``count`` rounds (module docstring), fewer where a sequence's next tree could reach past its reference;
    ``catch_up``: the draft (``family``'s) catches up after each accept (else the base runs alone: verify, accept,
    verify, ...). ``accept_hook``: given the accepted paths and the tree, returns the paths ``accept`` is given (a
    planted bug: the harness goes on as if the right ones were committed)."""
    table, seqs = case.table("base"), state.seqs
    b = len(seqs)
    depth = case.spec["draft_step"]
    for _ in range(count):
        if any(c + depth + 1 > len(s.tokens) - 1 for s, c in zip(seqs, state.committed)):
            break
        tree = propose(setup, case, state, cmp)
        n = max(len(t) for t in tree.tokens)
        if any(len(t) != n for t in tree.tokens):
            raise AssertionError("the proposer's trees differ in size")
        x = table[np.array(tree.tokens)]
        logits = setup.verify(x, tree.verify_tree()).to_numpy().reshape(b, n, -1)
        paths = []
        for i, s in enumerate(seqs):
            m = tree.size(i)
            c, toks, par = state.committed[i], tree.tokens[i][:m], tree.parents[i][:m]
            greedy = logits[i, :m].argmax(axis=1)
            for node in range(m):
                want = case.base_row(s, c, _node_path(toks, par, node))
                if want is not None:
                    cmp.base.values(want, logits[i, node],
                                    f"sequence {s.index} round {state.round} verify node {node} (committed {c})")
            path = _greedy_path(toks, par, greedy)
            for d, node in enumerate(path):  # every accepted node is on the true continuation
                if case.base_row(s, c, _node_path(toks, par, node)) is None:
                    raise ParityMismatch(f"sequence {s.index} round {state.round}: accepted node {node} has no "
                                         "reference row: it left Hugging Face's greedy continuation")
                cmp.base.token(s, c + d, int(greedy[node]), f"round {state.round} verify node {node}")
            paths.append(path)
        setup.accept(paths if accept_hook is None else accept_hook(paths, tree))
        lens = [len(p) for p in paths]
        cmp.accepted += lens
        if catch_up:
            (family or EAGLE).catch_up(setup, case, cmp, state, lens)
        state.committed = [c + m for c, m in zip(state.committed, lens)]
        state.round += 1
        state.done = [d + 1 for d in state.done]


def readmit(setup: Any, case: SpecCase, cmp: SpecCompare, state: State, slot: int, *, draft: bool = True,
            family: DraftFamily | None = None) -> None:
    """Between rounds, the sequence in ``slot`` ends and a new request takes the slot: its prompt again from the
    start (the others go on where they are); its base and draft prefills compared as :func:`prefill` does."""
    slots = setup.active.tolist()
    i = slots.index(slot)
    s = state.seqs[i]
    setup.release([slot])
    table = case.table("base")
    logits = setup.base_prefill(table[s.prompt][None], [s.prompt_length], slots=[slot]).to_numpy()
    cmp.base.row(s, s.prompt_length - 1, logits[0], "admitted base prefill")
    cmp.base.token(s, s.prompt_length - 1, int(logits[0].argmax()), "admitted base prefill")
    if setup.active.tolist() != slots:
        raise AssertionError(f"active slots {setup.active.tolist()} after admitting slot {slot}, not {slots}")
    state.committed[i], state.done[i] = s.prompt_length, 0
    if draft:
        (family or EAGLE).draft_prefill(setup, case, cmp, state, [i], [slot])


# -- proposers -------------------------------------------------------------------------------------------------------


def replayed_trees(*, through_draft: bool, cut: dict[int, int] | None = None) -> Proposer:
    """The case's trees of each round (``tree_tokens_i[r]``), made from Hugging Face's tokens. ``through_draft``:
    the draft proposes them first, level by level (``TOP_K`` nodes a level, parents as the tree has them), its
    logits at every node held to the draft's reference. ``cut``: sequence index -> the nodes of its trees the base
    verifies (the rest are padding rows of the verify step)."""
    def propose(setup: Any, case: SpecCase, state: State, cmp: SpecCompare) -> Tree:
        seqs = state.seqs
        tokens = [case.arrays[f"tree_tokens_{s.index}"][r].tolist() for s, r in zip(seqs, state.done)]
        parents = [case.arrays[f"tree_parents_{s.index}"][r].tolist() for s, r in zip(seqs, state.done)]
        for i, (s, r) in enumerate(zip(seqs, state.done)):
            want = int(case.arrays[f"tree_commits_{s.index}"][r])
            if state.committed[i] != want:
                raise ParityMismatch(f"sequence {s.index} round {r}: {state.committed[i]} tokens committed, the "
                                     f"replayed tree was made after {want}")
        if through_draft:
            _propose_levels(setup, case, state, cmp, tokens, parents)
        real = None if not cut else [cut.get(s.index, len(t)) for s, t in zip(seqs, tokens)]
        return Tree(tokens, parents, real)
    return propose


def _propose_levels(setup: Any, case: SpecCase, state: State, cmp: SpecCompare, tokens: list[list[int]],
                    parents: list[list[int]]) -> None:
    """The draft proposes the verify trees' nodes 1.. level by level (draft node j = verify node j + 1)."""
    table, k, depth = case.table("base"), case.spec["draft_top_k"], case.spec["draft_step"]
    for level in range(depth):
        nodes = range(1 + level * k, 1 + (level + 1) * k)
        x = table[np.array([[t[j] for j in nodes] for t in tokens])]
        par = np.array([[p[j] - 1 for j in nodes] for p in parents])  # -1: the root (verify node 0)
        logits = setup.draft_propose(x, parents=par).to_numpy().reshape(len(tokens), k, -1)
        for i, s in enumerate(state.seqs):
            for a, j in enumerate(nodes):
                path = _node_path(tokens[i], parents[i], j)[1:]
                want = case.draft_node(s, state.committed[i], path)
                if want is not None:
                    cmp.draft.values(want, logits[i, a], f"sequence {s.index} round {state.round} draft node "
                                                         f"{j - 1} (level {level})")


def draft_chains(d2t: np.ndarray) -> Proposer:
    """The draft's own trees, as ``trtio generate`` drafts them: ``draft_top_k`` chains ``draft_step`` deep, the
    first level the root's top-k, each chain then extended by its node's top-1 (draft columns mapped to base
    tokens through ``d2t``); the draft proposes every level but the last."""
    def propose(setup: Any, case: SpecCase, state: State, cmp: SpecCompare) -> Tree:
        assert state.root is not None
        table, k, depth = case.table("base"), case.spec["draft_top_k"], case.spec["draft_step"]
        b = len(state.seqs)
        level = [[int(d2t[c]) for c in np.argsort(-row, kind="stable")[:k]] for row in state.root]
        tokens = [[int(s.tokens[c])] + lv for s, c, lv in zip(state.seqs, state.committed, level)]
        parents = [[-1] + [0] * k for _ in range(b)]
        for n in range(1, depth):  # the draft reads level n - 1 (joining its tree) and proposes level n
            par = np.full(k, -1) if n == 1 else np.arange(k) + (n - 2) * k
            logits = setup.draft_propose(table[np.array(level)], parents=par).to_numpy().reshape(b, k, -1)
            level = [[int(d2t[int(row.argmax())]) for row in rows] for rows in logits]
            for i in range(b):
                tokens[i] += level[i]
                parents[i] += [1 + (n - 1) * k + a for a in range(k)]
        return Tree(tokens, parents)
    return propose


#: EAGLE3's draft (and MTP's, which speaks its protocol with one base layer): shifted prefill and catch-up, top-k
#: chains of its own, trees proposed level by level.
EAGLE = DraftFamily(_eagle_prefill, _eagle_catch_up, draft_chains)


# -- the scenarios ---------------------------------------------------------------------------------------------------


def base_tree(setup: Any, case: SpecCase, cmp: SpecCompare, d2t: np.ndarray,
              accept_hook: AcceptHook | None = None, family: DraftFamily | None = None) -> None:
    """The base alone (a verify right after the base prefill): the replayed trees, every node compared."""
    state = prefill(setup, case, cmp, draft=False)
    rounds(setup, case, cmp, state, replayed_trees(through_draft=False), case.spec["rounds"], catch_up=False,
           accept_hook=accept_hook)


def draft_tree(setup: Any, case: SpecCase, cmp: SpecCompare, d2t: np.ndarray,
               accept_hook: AcceptHook | None = None, family: DraftFamily | None = None) -> None:
    """The pair: the draft proposes the replayed trees (its node logits compared; a block draft proposes none),
    the base verifies them (the last sequence's without its last level: padding rows in the verify step), the
    draft catches up over the accepted tokens (its logits compared)."""
    family = family or EAGLE
    state = prefill(setup, case, cmp, family=family)
    last = state.seqs[-1].index
    full = 1 + case.spec["draft_step"] * case.spec["draft_top_k"]
    rounds(setup, case, cmp, state,
           replayed_trees(through_draft=family.proposes, cut={last: full - case.spec["draft_top_k"]}),
           case.spec["rounds"], accept_hook=accept_hook, family=family)


def draft_rounds(setup: Any, case: SpecCase, cmp: SpecCompare, d2t: np.ndarray,
                 accept_hook: AcceptHook | None = None, count: int = 4, family: DraftFamily | None = None) -> None:
    """The pair on its own drafts (EAGLE3 / MTP: top-k chains; a block draft: its block's guesses): accepted tokens
    and nodes, prefill and catch-up rows compared."""
    family = family or EAGLE
    state = prefill(setup, case, cmp, family=family)
    rounds(setup, case, cmp, state, family.own_drafts(d2t), count, accept_hook=accept_hook, family=family)


def admission(setup: Any, case: SpecCase, cmp: SpecCompare, d2t: np.ndarray,
              accept_hook: AcceptHook | None = None, family: DraftFamily | None = None) -> None:
    """The pair on the replayed trees: after a round the second sequence ends and a new request (its prompt again)
    is admitted into its slot; the others go on from where they are, the new one from its first tree."""
    family = family or EAGLE
    state = prefill(setup, case, cmp, family=family)
    propose = replayed_trees(through_draft=family.proposes)
    rounds(setup, case, cmp, state, propose, 1, accept_hook=accept_hook, family=family)
    readmit(setup, case, cmp, state, int(setup.active[1]), family=family)
    rounds(setup, case, cmp, state, propose, case.spec["rounds"] - 1, accept_hook=accept_hook, family=family)


SPEC_SCENARIOS: dict[str, Callable[..., None]] = {
    "base_tree": base_tree, "draft_tree": draft_tree, "draft_rounds": draft_rounds, "admission": admission,
}


def run_spec(case: SpecCase, scenario: str, backend: str = "host", graphs: bool = False,
             hooks: dict[str, Hook] | None = None, accept_hook: AcceptHook | None = None,
             family: DraftFamily | None = None) -> SpecCompare:
    cmp = SpecCompare()
    with spec_setup(case, backend, graphs, hooks) as (setup, d2t):
        SPEC_SCENARIOS[scenario](setup, case, cmp, d2t, accept_hook=accept_hook, family=family)
    return cmp


def planted_spec(case: SpecCase, scenario: str, hooks: dict[str, Hook] | None = None,
                 accept_hook: AcceptHook | None = None, family: DraftFamily | None = None) -> str:
    """``scenario`` with a planted bug (engine input hooks by role, or wrong accepted paths); how the parity check
    failed. AssertionError if it passed: the bug went unseen."""
    try:
        run_spec(case, scenario, hooks=hooks, accept_hook=accept_hook, family=family)
    except ParityMismatch as exc:
        return f"mismatch: {exc}"
    except trtio.errors.InvalidValueError as exc:
        return f"refused: {exc}"
    raise AssertionError(f"{case.name}/{scenario}: the planted bug passed the parity check")
