"""The feature seam: how a model family plugs into the dense core (``docs/architecture.md``, "Families and
components").

The core binds a dense LLM. A **family** (``trtio/families/<name>/``) adds what its models need beside that, in two
parts, each a subclass of a base class here:

* its typed config, a :class:`FamilyConfig`: the :class:`~trtio._config.LLMEngineConfig` keywords it owns, how it
  reads its Edge-LLM keys, its checks against the dense core and its declarations (pure functions of the config the
  core asks for: per-layer KV geometry, bindings, members). ``cfg.feature(HybridConfig)`` returns it, or None;
* its :class:`Feature`: its part of a bound engine, with a hook at each step point.

The family table (``trtio/families/__init__.py``, imported by the facade before anything else) imports every family
package, and each registers its parts here (:func:`register_family`), so the generic modules reach the families
through this module alone and never import one: they call :func:`family_configs` and the features of a config, in
the table's order.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

import numpy as np

from trtio._stream import Stream, StreamLike
from trtio.errors import InvalidValueError, ShapeError

__all__ = ["Component", "FamilyConfig", "Feature", "FeatureSet", "Found", "Held", "StepInput", "component_folders",
           "component_named", "components", "family_configs", "keyword_owner", "register_component", "register_family",
           "register_feature"]

#: An Edge-LLM key a family cannot bind where it is found: (dotted key, what it marks, detail).
Found = tuple[str, str, str]


class FamilyConfig(abc.ABC):
    """A family's typed config (subclasses are frozen dataclasses; see the module docstring).

    The family owns the :class:`~trtio._config.LLMEngineConfig` keywords in :attr:`KEYWORDS` (they are its JSON
    keys too, and read-only attributes of the config, for the public API): the config hands them to
    :meth:`from_keywords` with its dense core's values, and keeps what it returns in ``cfg.features``.
    """

    #: The LLMEngineConfig keywords this family owns, each with its default (the value that means "not used").
    KEYWORDS: ClassVar[Mapping[str, Any]] = {}
    #: Keyword -> the Edge-LLM key it is read from (a failed check names that key in a file's error).
    SOURCE_KEYS: ClassVar[Mapping[str, str]] = {}
    #: The bindings of an engine the engine state owns for this family where the engine declares them (its
    #: :meth:`kv_pools` binds them).
    STATE_BINDINGS: ClassVar[tuple[str, ...]] = ()
    #: Other read-only attributes this family offers on the config (the public API's spellings, e.g.
    #: ``cfg.is_hybrid``): name -> f(cfg, this family's config or None).
    ALIASES: ClassVar[Mapping[str, Callable[[Any, Any], Any]]] = {}

    @classmethod
    @abc.abstractmethod
    def from_keywords(cls, given: Mapping[str, Any], core: Mapping[str, Any]) -> FamilyConfig | None:
        """This family's config from its keywords (``given``: every one of :attr:`KEYWORDS`, at its default where
        the caller gave none) and the dense core's values (``core``); None where the model does not use it."""

    @abc.abstractmethod
    def keywords(self) -> dict[str, Any]:
        """The values of :attr:`KEYWORDS` this config stands for (as given: JSON-able after ``to_json``)."""

    def to_json(self) -> dict[str, Any]:
        """:meth:`keywords` as plain JSON values."""
        return self.keywords()

    def validate(self, cfg: Any) -> None:
        """Check this config against the dense core of ``cfg`` (an LLMEngineConfig); raise ConfigError naming the
        keyword."""
        return None

    @property
    def rope_per_slot(self) -> bool:
        """Whether the model takes a RoPE table per sequence slot (positions a family computes per sequence) rather
        than one table the engines of a setup share."""
        return False

    def kv_geometry(self, layer: int) -> tuple[int, int] | None:
        """``(num_kv_heads, head_dim)`` of attention layer ``layer``'s KV cache where this family gives the layer a
        geometry of its own; None: the model's."""
        return None

    def registry(self, reg: Any, cfg: Any) -> Any:
        """The bindings of an engine of ``cfg`` with this family's: ``reg`` (a TensorRegistry: the PipelineIO-owned
        bindings on ``reg.contract``) with its own added or replaced, or a registry in its place."""
        return reg

    def members(self, cfg: Any, rows: int) -> list[Any]:
        """The PipelineIO members (TensorRequests) this family adds for an engine of ``cfg``, ``rows`` token rows at
        most (the ragged contract's layout)."""
        return []

    def step_requests(self, cfg: Any, place: str, batch: int, rows: int) -> list[Any]:
        """The step-block inputs (TensorRequests) this family adds for an engine of ``cfg`` (``batch`` sequences,
        ``rows`` token rows), at ``place`` in the block: ``"lengths"`` (written every step with the lengths) or
        ``"pages"`` (with the page tables)."""
        return []

    def draft_rows(self, top_k: int, step: int) -> int | None:
        """The token rows a sequence's draft step takes in a round of ``step`` levels of ``top_k`` candidates (what
        the draft's ``max_draft_tree_size`` bounds), where this family's draft sizes its steps otherwise than an
        EAGLE-style tree (``top_k x step`` rows); None: that tree's."""
        return None

    def check_runs(self, base: Any, draft: Any, what: str) -> None:
        """Refuse a speculative pair (``base``, ``draft``: LLMEngineConfigs, this config one of theirs) trtio cannot
        run, before anything is allocated (a ConfigError naming ``what`` and the key)."""
        return None

    def bind_pipeline(self, io: Any, tm: Any, cfg: Any) -> None:
        """Bind this family's members of ``io`` (a PipelineIO) for an engine of ``cfg`` into ``tm`` (its tensor map,
        being built)."""
        return None

    @classmethod
    def input_problems(cls, eio: Any, cfg: Any, bound: set[str]) -> tuple[set[str], list[str]]:
        """The engine inputs this family binds where a setup makes its feature (whether or not ``cfg`` has the family),
        and the problems of those not among ``bound`` (the inputs the setup binds): each named once, not as one
        unknown binding each."""
        return set(), []

    def engine_problems(self, eio: Any, cfg: Any, max_batch: int) -> list[str]:
        """Where the engine's declared state (``eio``: its EngineIO) disagrees with what this family says of it, for
        ``max_batch`` sequence slots (one line each, naming the binding)."""
        return []

    # -- the KV state, RoPE tables and token tables of an engine of this family ----------------------------------
    def kv_pools(self, eio: Any, cfg: Any, max_batch: int, staged: Mapping[str, Any]) -> KVPools | None:
        """What this family changes in the KV pools of an engine (``eio``: its EngineIO) of ``cfg`` for ``max_batch``
        slots (:class:`KVPools`); ``staged``: the step block's tensors where the setup stages pages per step (empty
        where it does not). None: nothing."""
        return None

    def borrowed_state(self, cfg: Any) -> set[str]:
        """KV pools an engine of this family reads but does not own: inputs it declares without an output updating
        them in place, which its feature binds (:meth:`Feature.constants`) to another engine's pools. The engine
        state allocates nothing for them and does not ask for their outputs."""
        return set()

    def own_sized_pools(self, cfg: Any) -> set[str]:
        """The KV pools whose page count may differ from the full pool's (the page table's pool is another's)."""
        return set()

    def declared_state(self, cfg: Any, max_batch: int) -> list[Any] | None:
        """What an engine of the ragged contract declares for its paged KV state (TensorSpecs, as
        :func:`trtio._state.paged_state_specs` gives a dense engine's) where this family declares it otherwise;
        None: the dense declaration."""
        return None

    def rope_rows(self, cfg: Any, positions: Any) -> Any:
        """The rows of the RoPE table the engines of a setup share (float32 ``[len(positions), width]``) where this
        family computes them its own way; None: the model's RoPE."""
        return None

    def rope_gathers(self, cfg: Any) -> list[tuple[str, str, int]]:
        """Further per-token RoPE rows a step gathers at its tokens' positions, beside the shared table's:
        (PipelineIO member the rows go to, member of the table they come from, bytes of one row)."""
        return []

    def token_table(self, cfg: Any, path: Any) -> Any:
        """A second per-token table an engine directory at ``path`` holds for this family, gathered with the token
        embeddings (float16 ``[rows, width]``); None: none."""
        return None

    def check_pair(self, base: Any, draft: Any, files: tuple[Any, Any]) -> Any:
        """A speculative pair read from a directory (``base`` and ``draft`` LLMEngineConfigs, this config one of
        theirs; ``files``: their config files): raise ConfigError naming the file and the key where they do not fit
        together, or return the base config the pair runs with (``base`` itself where nothing changes)."""
        return base

    # -- Edge-LLM's config.json ----------------------------------------------------------------------------------
    @classmethod
    def read_edgellm(cls, r: Any, role: str, layers: int) -> dict[str, Any]:
        """The keywords this family reads from an Edge-LLM config (``r``: the mapping's reader, which marks each
        key it reads as used), for an engine of ``role`` with ``layers`` attention layers; {} where the config is
        not one of this family's. A key it cannot honour is refused naming it. Core keywords it returns (a RoPE it
        reads its own way) are not read again."""
        return {}

    @classmethod
    def unsupported(cls, r: Any) -> list[Found]:
        """The keys of an Edge-LLM config that mark what this family binds but the config does not let it bind
        (refused when the config is read, naming the key)."""
        return []


@dataclass
class StateBinding:
    """A binding the engine state owns for a family (:meth:`FamilyConfig.kv_pools`): bound to ``tensor`` (a staged
    tensor), or to the state's page table (``tensor`` None), or, ``own`` (a shape), to a small tensor of the state's
    own of that shape, viewed at ``view``. ``spec``: its TensorSpec (the one source of its bound shape)."""

    spec: Any
    tensor: Any = None
    own: tuple[int, ...] | None = None
    view: tuple[int, ...] | None = None


@dataclass
class KVPools:
    """What a family changes in an engine's KV pools: ``shared`` pools read through another's (a KV-sharing consumer ->
    its donor: nothing is allocated for it), ``pages`` of the pools with a page count of their own, the ``bindings``
    the state owns for the family, and the ``parts`` its feature keeps (a bounded window's page book)."""

    shared: dict[str, str] = field(default_factory=dict)
    pages: dict[str, int] = field(default_factory=dict)
    bindings: list[StateBinding] = field(default_factory=list)
    parts: dict[str, Any] = field(default_factory=dict)

    def merge(self, other: KVPools) -> None:
        self.shared.update(other.shared)
        self.pages.update(other.pages)
        self.bindings += other.bindings
        self.parts.update(other.parts)


F = TypeVar("F", bound=FamilyConfig)

_FAMILIES: list[type[FamilyConfig]] = []
_OWNERS: dict[str, type[FamilyConfig]] = {}


def register_family(config: type[F]) -> type[F]:
    """Register a family's typed config (the family table does, in its order); its keywords become
    LLMEngineConfig keywords. Returns ``config``, so that it reads as a class decorator."""
    if config in _FAMILIES:
        return config
    taken = sorted(set(config.KEYWORDS) & set(_OWNERS))
    if taken:
        raise InvalidValueError(f"{config.__name__}: keyword {taken[0]!r} is {_OWNERS[taken[0]].__name__}'s")
    _FAMILIES.append(config)
    _OWNERS.update(dict.fromkeys(config.KEYWORDS, config))
    return config


def family_configs() -> tuple[type[FamilyConfig], ...]:
    """Every registered family's typed config class, in the family table's order."""
    return tuple(_FAMILIES)


def keyword_owner(name: str) -> type[FamilyConfig] | None:
    """The family whose typed config owns the LLMEngineConfig keyword ``name`` (None: no family's)."""
    return _OWNERS.get(name)


# -- the runtime part ------------------------------------------------------------------------------------------------

@dataclass
class Held:
    """What a feature keeps for a pinned prefix (:meth:`Feature.pin`): rows of its own pools, held as the prefix holds
    its KV pages (``pages[key]`` of ``pools[key]``, given back with the prefix), and what the prefix records of its
    tokens (``positions``: MRoPE's position record)."""

    pages: dict[str, list[int]] = field(default_factory=dict)
    pools: dict[str, Any] = field(default_factory=dict)
    positions: Any = None


class Feature:
    """A family's part of one engine of a setup (``docs/architecture.md``, "Families and components": the step
    points). A subclass is registered for its family's typed config (:func:`register_feature`); a setup makes one for
    each of its engines whose config has that family (:meth:`make`), before the engine is bound, and closes it with
    itself. Every hook below is a no-op here: a family implements those it needs.

    The hooks run in the family table's order, on the calling thread, inside the setup's call rules (one thread at a
    time, the stream rule: ``docs/architecture.md``, "Steps"); device work they return is enqueued by the setup on
    the step's stream before the engine (in its CUDA graph where the step is captured).
    """

    #: The typed config this feature is the runtime part of (set by :func:`register_feature`).
    config_type: ClassVar[type[FamilyConfig]]
    #: The prefill keywords this family takes (``mrope_positions``, ``ple_embeds``, ...): the setup hands them to
    #: :meth:`check_prompt`; given to a setup whose engine lacks the family, they are refused (:meth:`absent`).
    PROMPT_INPUTS: ClassVar[tuple[str, ...]] = ()
    #: Setup attributes this family answers (``recurrent``, ``lora``, ...), each with its value where it is absent.
    ATTRIBUTES: ClassVar[Mapping[str, Any]] = {}
    #: Setup calls this family answers (``set_lora``): a method of the part; :meth:`absent_call` where it is absent.
    METHODS: ClassVar[tuple[str, ...]] = ()
    #: The per-token keyword an LLM setup's prefill and decode take for this family beside their embeddings
    #: (``ple_embeds``), None: none. Its part then implements :class:`StepInput`'s calls, which the setup makes.
    STEP_INPUT: ClassVar[str | None] = None

    @classmethod
    def make(cls, config: Any, cfg: Any, role: str, ctx: Any, eio: Any) -> Feature | None:
        """This family's part of an engine of ``role`` (``"llm"``, ``"base"``, ``"draft"``) whose config ``cfg`` has
        this family (``config``: its typed config; ``eio``: the engine's declared I/O), before the engine is bound:
        what must outlive the engine's executor is entered into ``ctx.stack`` here. None: nothing to do for this
        engine."""
        return None

    @classmethod
    def absent_call(cls, name: str, *args: Any) -> Any:
        """The setup call ``name`` (one of :attr:`METHODS`) on a setup whose engine lacks this family."""
        raise ShapeError(cls.absent(name))

    @classmethod
    def absent(cls, name: str) -> str:
        """Why the input or attribute ``name`` of this family is refused by a setup whose engine lacks the family."""
        return f"{name}: given, but the engine has no {cls.config_type.__name__} inputs"

    def constants(self) -> Mapping[str, Any]:
        """Engine inputs this part binds to tensors it owns (bound with the engine, before its executor)."""
        return {}

    def bound(self, engine: Any, ctx: Any) -> None:
        """The engine is bound (its state, tensor map and executor exist): fill and bind what is this family's."""

    def attribute(self, name: str) -> Any:
        """The value of the setup attribute ``name`` (one of :attr:`ATTRIBUTES`)."""
        return getattr(self, name)

    # -- a prefill ---------------------------------------------------------------------------------------------------
    def check_prompt(self, inputs: Mapping[str, Any], batch: int, seq: int, lengths: Any, past: Any,
                     stream: Any = None) -> Any:
        """Check a prefill's inputs of this family (``inputs``: its :attr:`PROMPT_INPUTS`, None where not given)
        before anything changes (``stream``: the step's, a foreign array's producer ordered before it); what it
        returns is handed to :meth:`prompt_work`."""
        return None

    def check_past(self, past: Any, what: str) -> None:
        """Refuse a prefill of ``what`` over ``past`` cached tokens per sequence (``past_lengths=`` or ``prefix=``)
        that this family's engine cannot run (raise naming ``what``)."""

    def prompt_work(self, rows: Any, past: Any, lengths: Any, checked: Any, new: bool,
                    prefixes: Any, stream: Stream) -> tuple[Any, ...]:
        """Device work before a prefill's engine (the sequences of slots ``rows``, ``past`` tokens cached before it,
        None: none; ``new``: it starts them, with ``prefixes`` where they start from one), for the setup to enqueue
        on ``stream`` before the step's own work. Runs inside the sequences' transaction."""
        return ()

    def prompt_done(self, ok: bool) -> str | None:
        """The prefill succeeded (``ok``) or failed after :meth:`prompt_work`; where a failure left device state a
        retry cannot undo, why (the setup then breaks)."""
        return None

    def stage(self, engine: Any, slots: Any, past: Any, lengths: Any, new: bool) -> None:
        """Before a prefill's or a decode's inputs are staged (uploaded with one copy): write what this family adds to
        the step block for the sequences of ``slots`` (None: ``0 .. batch - 1``), ``lengths`` new tokens after ``past``
        cached ones (``new``: a prefill that starts them)."""

    # -- decodes, prefixes, rounds -----------------------------------------------------------------------------------
    def decode_room(self, lengths: Any) -> int | None:
        """How many planned decodes of sequences of ``lengths`` may run before this family needs a checked step
        (None: no limit of its own)."""
        return None

    def check_pin(self, what: str) -> None:
        """Refuse a prefix this family cannot keep (raise naming ``what``)."""

    def pin(self, slot: int, tokens: int, kept: int, have: int, what: str, stream: Stream) -> Held | None:
        """Keep what a prefix of the first ``tokens`` of ``slot`` (which holds ``have``; the prefix keeps ``kept`` KV
        entries: fewer in a spec-decode setup) needs of this family, on ``stream``; None: nothing."""
        return None

    def release(self, slots: Any) -> None:
        """The sequences of ``slots`` ended."""

    def check_verify(self, parents: Any, real: Any) -> None:
        """Refuse a verify tree (``parents`` [batch, nodes], ``real`` [batch, nodes]) this family cannot run."""

    def accept(self, slots: Any, rows: Any, lengths: Any, nodes: int, stream: Stream) -> None:
        """A speculative accept: sequence ``i`` of ``slots`` accepted the verify rows ``rows[i, :lengths[i]]`` (its
        path, root first; ``rows`` [batch, longest], -1 past each path; row ``i * nodes + node``, ``nodes`` the
        verify's nodes a sequence); commit this family's state of it on ``stream``."""

    def reports(self) -> list[Any]:
        """MemoryReports of what this part owns."""
        return []


_FEATURES: dict[type[FamilyConfig], type[Feature]] = {}


def register_feature(feature: type[Feature], config: type[FamilyConfig]) -> type[Feature]:
    """Register ``feature`` as the runtime part of the family whose typed config is ``config`` (the family table
    does)."""
    feature.config_type = config
    _FEATURES[config] = feature
    return feature


class FeatureSet:
    """The features of a setup's engines, in the family table's order: the setup calls them at each step point
    through this (see :class:`Feature`)."""

    def __init__(self) -> None:
        self.parts: list[Feature] = []
        self._roles: dict[int, str] = {}  # id(part) -> the role of the engine it was made for
        self._inputs = {name: f for f in _FEATURES.values() for name in f.PROMPT_INPUTS}
        self._attributes = {name: f for f in _FEATURES.values() for name in f.ATTRIBUTES}
        self._named: dict[str, Feature] = {}  # setup attribute or call -> the part that answers it
        # The parts that implement a hook a step calls (the others' is Feature's no-op): a step of a setup without
        # them does nothing for the families.
        self._stagers: list[Feature] = []
        self._rooms: list[Feature] = []
        self._accepters: list[Feature] = []
        self._verifiers: list[Feature] = []

    def make(self, cfg: Any, role: str, ctx: Any, eio: Any) -> dict[str, Any]:
        """Make the parts of an engine of ``role`` with config ``cfg`` and declared I/O ``eio`` (before it is bound);
        returns the constants they bind."""
        constants: dict[str, Any] = {}
        for config in family_configs():
            found = cfg.feature(config)
            kind = _FEATURES.get(config)
            part = kind.make(found, cfg, role, ctx, eio) if found is not None and kind is not None else None
            if part is not None:
                self.parts.append(part)
                self._roles[id(part)] = role
                constants.update(part.constants())
                self._named.update(dict.fromkeys((*part.ATTRIBUTES, *part.METHODS), part))
                for hook, parts in (("stage", self._stagers), ("decode_room", self._rooms),
                                    ("accept", self._accepters), ("check_verify", self._verifiers)):
                    if getattr(type(part), hook) is not getattr(Feature, hook):
                        parts.append(part)
        return constants

    def bound(self, engine: Any, ctx: Any) -> None:
        """``engine`` (a BoundEngine) is bound: its parts attach to it."""
        for part in self.parts:
            if self._roles[id(part)] == engine.role:
                part.bound(engine, ctx)

    def attribute(self, name: str) -> Any:
        """A setup attribute a family answers (its value where the family is absent)."""
        for part in self.parts:
            if name in part.ATTRIBUTES:
                return part.attribute(name)
        return self._attributes[name].ATTRIBUTES[name]

    def part(self, name: str) -> Any:
        """The part that answers the setup attribute or call ``name`` (None: the family is absent)."""
        return self._named.get(name)

    def absent_call(self, name: str, *args: Any) -> Any:
        """The setup call ``name`` where its family is absent (:meth:`Feature.absent_call`)."""
        owner = next(f for f in _FEATURES.values() if name in f.METHODS)
        return owner.absent_call(name, *args)

    def check_prompt(self, inputs: Mapping[str, Any], batch: int, seq: int, lengths: Any, past: Any,
                     stream: Any = None) -> list[Any]:
        """Every part's checked prefill inputs (in order); an input given that no part takes is refused."""
        taken = {name for p in self.parts for name in p.PROMPT_INPUTS}
        for name, value in inputs.items():
            if name not in taken and value is not None and not (isinstance(value, (list, tuple)) and not value):
                raise ShapeError(self._inputs[name].absent(name))
        return [p.check_prompt({n: inputs.get(n) for n in p.PROMPT_INPUTS}, batch, seq, lengths, past, stream)
                for p in self.parts]

    def check_past(self, role: str, past: Any, what: str) -> None:
        """The parts of the engine of ``role``: :meth:`Feature.check_past`."""
        for p in self.parts:
            if self._roles[id(p)] == role:
                p.check_past(past, what)

    def prompt_work(self, checked: list[Any], rows: Any, past: Any, lengths: Any, new: bool, prefixes: Any,
                    stream: Stream) -> tuple[Any, ...]:
        work: tuple[Any, ...] = ()
        for p, c in zip(self.parts, checked):
            work += p.prompt_work(rows, past, lengths, c, new, prefixes, stream)
        return work

    def prompt_done(self, ok: bool) -> str | None:
        reasons = [r for r in (p.prompt_done(ok) for p in self.parts) if r is not None]
        return reasons[0] if reasons else None

    def stage(self, engine: Any, slots: Any, past: Any, lengths: Any, new: bool) -> None:
        """The parts of ``engine`` (a BoundEngine): :meth:`Feature.stage`."""
        for p in self._stagers:
            if self._roles[id(p)] == engine.role:
                p.stage(engine, slots, past, lengths, new)

    def stage_decode(self, engine: Any, slots: Any, lengths: Any) -> None:
        """:meth:`stage` for a decode: one new token after each sequence's ``lengths``."""
        if self._stagers:
            self.stage(engine, slots, lengths, np.ones_like(lengths), False)

    def step_input(self) -> Any:
        """The part that takes its family's per-token step keyword (:attr:`Feature.STEP_INPUT`), else a
        :class:`StepInput` refusing every one given."""
        found = next((p for p in self.parts if p.STEP_INPUT is not None), None)
        owners = {str(f.STEP_INPUT): f for f in _FEATURES.values() if f.STEP_INPUT is not None}
        return found if found is not None else StepInput(owners)

    def decode_room(self, lengths: Any, room: int) -> int:
        """``room`` lowered to what every part allows."""
        for p in self._rooms:
            found = p.decode_room(lengths)
            if found is not None:
                room = min(room, found)
        return room

    def check_pin(self, what: str) -> None:
        for p in self.parts:
            p.check_pin(what)

    def pin(self, slot: int, tokens: int, kept: int, have: int, what: str, stream: Stream) -> Held:
        out = Held()
        for p in self.parts:
            found = p.pin(slot, tokens, kept, have, what, stream)
            if found is not None:
                out.pages.update(found.pages)
                out.pools.update(found.pools)
                out.positions = found.positions if found.positions is not None else out.positions
        return out

    def release(self, slots: Any) -> None:
        for p in self.parts:
            p.release(slots)

    def check_verify(self, parents: Any, real: Any) -> None:
        for p in self._verifiers:
            p.check_verify(parents, real)

    def accept(self, slots: Any, rows: Any, lengths: Any, nodes: int, stream: Stream) -> None:
        for p in self._accepters:
            p.accept(slots, rows, lengths, nodes, stream)

    def reports(self) -> list[Any]:
        return [r for p in self.parts for r in p.reports()]


# -- components -------------------------------------------------------------------------------------------------------

class Component(abc.ABC):
    """An engine beside the LLM in an Edge-LLM engine directory (``trtio/components/<name>/``): the folder it lives
    in, how :class:`~trtio.edgellm.EngineDir` reads its config (checked against the LLM's), and how
    :func:`~trtio._setups.create_from_engine_dir` binds it and attaches it to the LLM's setup. The component table
    (``trtio/components/component_table.py``) registers each (:func:`register_component`)."""

    #: Its name: the role :meth:`EngineDir.engine_path <trtio.edgellm.EngineDir.engine_path>` takes, the name
    #: ``create_from_engine_dir(components=...)`` takes, and the setup attribute it is attached as.
    NAME: ClassVar[str]
    #: Its folder in an engine directory, its config and engine files there, and what it is (in messages).
    FOLDER: ClassVar[str]
    CONFIG_FILE: ClassVar[str] = "config.json"
    ENGINE_FILE: ClassVar[str]
    WHAT: ClassVar[str]

    @classmethod
    @abc.abstractmethod
    def read(cls, folder: Any, llm: Any) -> Any:
        """Its config from ``folder`` (a Path), checked against ``llm`` (the LLM's LLMEngineConfig); None where the
        folder holds no config of it. ConfigError naming the file and the key where it does not fit."""

    @classmethod
    def check_attach(cls, llm: Any, part: Any) -> None:
        """Refuse ``part`` (this component's setup) attached to an LLM setup of config ``llm`` where it does not fit
        (ConfigError naming the key)."""
        return None

    @classmethod
    @abc.abstractmethod
    def attach(cls, setup: Any, engine: Any, config: Any, stream: StreamLike = None, *, graphs: bool = False) -> None:
        """Bind ``engine`` (loaded from its engine file) with ``config`` and attach it to ``setup`` (the LLM's: it is
        closed with it), on the LLM setup's backend; ``stream`` orders its construction."""


_COMPONENTS: dict[str, type[Component]] = {}


def register_component(component: type[Component]) -> type[Component]:
    """Register a component (the component table does)."""
    _COMPONENTS[component.NAME] = component
    return component


def components() -> tuple[type[Component], ...]:
    """Every registered component, in the component table's order."""
    return tuple(_COMPONENTS.values())


def component_named(name: str) -> type[Component] | None:
    """The component called ``name`` (None: no registered component)."""
    return _COMPONENTS.get(name)


def component_folders() -> dict[str, type[Component]]:
    """Folder name -> the component that binds it."""
    return {c.FOLDER: c for c in _COMPONENTS.values()}


#: What :meth:`StepInput.prepare` asks of the setup once the step is known to take the input: a closed or broken setup
#: refused, then the step's stream (ordered after the last call's) and the setup's call rules (its Calls).
Ready = Callable[[], "tuple[Stream, Any]"]


class StepInput:
    """The calls an LLM setup makes for a family's per-token step input (:attr:`Feature.STEP_INPUT`: Gemma 4's
    ``ple_embeds``), as this class makes them for a setup whose engine takes none: a decode plan runs as it is fed
    none, and one given is refused (the message of the family it belongs to)."""

    def __init__(self, owners: Mapping[str, type[Feature]]) -> None:
        self._owners = owners

    def prepare(self, value: Any, inputs_embeds: Any, ready: Ready, *, now: bool = False) -> Any:
        """Check and stage ``value`` for a step of ``inputs_embeds`` (``ready``: the setup made ready, its stream);
        device work is enqueued ``now`` or returned (a decode makes it part of its plan's work: :meth:`plan_work`).
        Here: refuse ``value`` where given (nothing to stage)."""
        if value is not None:
            owner = next(iter(self._owners.values()), None)
            name = next(iter(self._owners), "input")
            raise ShapeError(owner.absent(name) if owner is not None else f"{name}: the engine takes none")
        return None

    def steady(self, plan: Any, value: Any, inputs_embeds: Any, stream: Stream, calls: Any) -> tuple[bool, bool]:
        """For a decode whose ``plan`` holds: (whether the plan takes ``value``, whether it was staged now). Here:
        the plan takes nothing only."""
        return value is None, False

    def plan_work(self, work: tuple[Any, ...], split: Any) -> tuple[Any, ...]:
        """A decode plan's device work: a step's ``work`` and what :meth:`prepare` returned (the same tuple for the
        same pair)."""
        return work
