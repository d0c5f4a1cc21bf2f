"""What the spec phases pay for the embeddings they are fed (issue 50).

A torch tensor is read through torch's public calls (:class:`trtio._foreign.TorchEmbeds`), as a steady decode reads
it: no DLPack capsule, and no new object for a buffer fed again; a host numpy input is staged with one copy, into
the ring slot the last upload used where its copy has run (its bytes still in the host's caches). Counted on the
host backend (CPU torch: host memory; and, standing in for a GPU, torch views of the host backend's device memory
read as DEVICE tensors) and at 8B-class scale on the dry-run backend; timings are ``trtio bench``'s, never tests.
"""

from __future__ import annotations

import ctypes
import dataclasses
import tracemalloc
import types
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

import trtio
from trtio import Location, Tensor
from trtio._cuda.backend import Backend
from trtio.testing import ReferenceEngine, toy_embedding
from trtio.testing.toy_engines import ToyEngines
from trtio.testing.toy_runtime import embed_batch

try:
    import torch
except ImportError:  # CI installs the CPU build (.ci/requirements.txt); elsewhere these tests skip
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")

E = toy_embedding(512, 64)
TOP_K, STEPS, VERIFY, BATCH, ACCEPT = 2, 3, 7, 4, 3
BINARY = [-1, 0, 0, 1, 1, 2, 2]
PATHS = [[0, 1, 3], [0, 2], [0, 2, 6], [0]]
PARENTS = [np.full(TOP_K, -1)] + [lv * TOP_K + np.arange(TOP_K) // 2 for lv in range(STEPS - 1)]
SHAPES = {"draft_propose": (BATCH, TOP_K, 64), "verify": (BATCH, VERIFY, 64), "draft_accept": (BATCH, ACCEPT, 64)}


def _setup(device: str = "host") -> trtio.SpecDecodeSetup:
    """A toy EAGLE pair (batch contract) on ``device`` (the host backend, or ``gpu``), graphs on, prefilled."""
    toys = ToyEngines.load()
    spec = dataclasses.replace(toys.eagle.spec, drafting_top_k=TOP_K, drafting_step=STEPS, verify_size=VERIFY)
    bundle = dataclasses.replace(toys.eagle, spec=spec).validate()
    base = ReferenceEngine.from_config(bundle.base, weights=toys.weights("toy-eagle/base"), device=device)
    draft = ReferenceEngine.from_config(bundle.draft, weights=toys.weights("toy-eagle/draft"), device=device)
    sd = trtio.create_for_spec_decode(base, draft, bundle, graphs=True)
    emb, lens = embed_batch(E, [[1, 2, 3, 4, 5], [7, 8], [9, 10, 11], [12]], np.float16)
    sd.base_prefill(emb, lens)
    sd.draft_prefill(emb, lens)
    return sd


def _values(r: int, phase: str) -> np.ndarray:
    """Round ``r``'s embeddings of ``phase`` (the same in every setup compared)."""
    rng = np.random.default_rng([r, len(phase)])
    shape = SHAPES[phase]
    return E[rng.integers(0, 512, shape[:2])].astype(np.float16)


def _round(sd: trtio.SpecDecodeSetup, feed: dict[str, Any]) -> list[np.ndarray]:
    """One round fed ``feed``'s input of each phase (every level the same buffer); every logits output."""
    out = [sd.draft_propose(feed["draft_propose"], parents=p).to_numpy() for p in PARENTS]
    out.append(sd.verify(feed["verify"], BINARY).to_numpy())
    sd.accept(PATHS)
    out.append(sd.draft_accept(feed["draft_accept"], np.array([len(p) for p in PATHS])).to_numpy())
    return out


@dataclasses.dataclass
class _Counts:
    """What the phases did with their inputs: DLPack imports, general-path reads, Tensors wrapped, and the objects
    each upload staged (by phase order)."""

    imports: int = 0
    general: int = 0
    wrapped: int = 0
    staged: list[Any] = dataclasses.field(default_factory=list)


@pytest.fixture
def counts(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Counts]:
    import trtio._foreign
    import trtio._inputs
    import trtio._setups.base
    import trtio._staging

    got = _Counts()

    def counting(module: Any, name: str, field: str) -> None:
        real = getattr(module, name)

        def spy(*args: Any, **kwargs: Any) -> Any:
            setattr(got, field, getattr(got, field) + 1)
            return real(*args, **kwargs)
        monkeypatch.setattr(module, name, spy)

    counting(trtio._inputs, "consume", "imports")
    counting(trtio._setups.base, "as_embeds", "general")
    real_wrap = Tensor.wrap.__func__  # type: ignore[attr-defined]

    def wrap(cls: type, *args: Any, **kwargs: Any) -> Tensor:
        got.wrapped += 1
        return real_wrap(cls, *args, **kwargs)
    monkeypatch.setattr(Tensor, "wrap", classmethod(wrap))
    for method in ("upload", "upload_rows"):
        real = getattr(trtio._staging.UploadRing, method)

        def staging(self: Any, values: Any, *args: Any, _real: Callable[..., Any] = real, **kwargs: Any) -> Any:
            got.staged.append(values)
            return _real(self, values, *args, **kwargs)
        monkeypatch.setattr(trtio._staging.UploadRing, method, staging)
    yield got


@needs_torch
def test_spec_phases_fed_cpu_torch_read_it_as_numpy_without_a_capsule_or_a_new_object(counts: _Counts) -> None:
    """Each phase fed a CPU torch buffer (written in place every round, as a runtime's lookup output) gives the
    logits of the same phase fed numpy; after the first round no phase imports a DLPack capsule or takes the general
    path, and each stages the very object it staged the round before (no new view). A buffer whose storage moved
    (``set_``) is read at its new address."""
    fed, plain = _setup(), _setup()
    buffers = {phase: torch.zeros(shape, dtype=torch.float16) for phase, shape in SHAPES.items()}
    try:
        staged: list[list[Any]] = []
        for r in range(4):
            if r == 3:  # the same tensor over new memory
                for phase, t in buffers.items():
                    t.set_(torch.zeros(SHAPES[phase], dtype=torch.float16))
            for phase, t in buffers.items():
                t.copy_(torch.from_numpy(_values(r, phase)))
            if r == 1:
                counts.imports = counts.general = 0
            counts.staged.clear()
            got = _round(fed, buffers)
            staged.append(list(counts.staged))
            want = _round(plain, {phase: _values(r, phase) for phase in SHAPES})
            for i, (g, w) in enumerate(zip(got, want)):
                np.testing.assert_array_equal(g, w, err_msg=f"round {r}, output {i}")
        assert (counts.imports, counts.general) == (0, 0), "no capsule, no general path after the first round"
        assert len(staged[1]) == STEPS + 2, "a staged copy per level, verify and the catch-up"
        assert all(a is b for a, b in zip(staged[1], staged[2])), "the same view of each buffer every round"
        assert not any(a is b for a, b in zip(staged[2], staged[3])), "a buffer moved: read where it is now"
    finally:
        fed.close()
        plain.close()


@needs_torch
def test_a_setup_keeps_the_last_torch_inputs_it_read_until_it_is_closed() -> None:
    """The reader keeps the views of the last few torch tensors a setup read, and those tensors with them (as the
    setup keeps the inputs its calls read): a tensor dropped by the caller lives on until the setup is closed."""
    import gc
    import weakref

    sd = _setup()
    x = torch.from_numpy(_values(0, "verify"))
    gone = weakref.ref(x)
    sd.verify(x, BINARY)
    del x
    gc.collect()
    assert gone() is not None, "kept by the reader"
    sd.close()
    gc.collect()
    assert gone() is None, "closed: let go"


def _torch_over(t: Tensor) -> Any:
    """A torch tensor over ``t``'s bytes (host backend: its device memory is host memory torch can read)."""
    raw = (ctypes.c_uint16 * (t.nbytes // 2)).from_address(t.data_ptr)
    return torch.frombuffer(raw, dtype=torch.float16).view(t.shape)


@needs_torch
def test_spec_phases_fed_device_torch_read_it_in_place_without_a_capsule_or_a_new_tensor(
        host: Backend, counts: _Counts, monkeypatch: pytest.MonkeyPatch) -> None:
    """On the GPU a phase reads a torch CUDA tensor as a DEVICE Tensor over its memory. Here the reader is made for
    "device -1" (what get_device() says of a host tensor) and fed torch views of the host backend's device memory,
    with torch's current stream another than the step's: each phase gives the logits of the same phase fed trtio
    Tensors over the same bytes, copies from the torch tensor's own address, orders torch's stream before its own
    once per call, and after the first round wraps no new Tensor and imports no capsule."""
    import trtio._foreign
    import trtio._setups.base

    torch_stream = trtio.Stream.create(host)
    ordered: list[tuple[int, int]] = []
    monkeypatch.setattr(trtio._foreign, "_order_after", lambda be, producer, consumer: ordered.append((producer,
                                                                                                      consumer)))

    def reader(be: Backend, dtype: Any, wrap: Any) -> Any:
        made = trtio._foreign.TorchEmbeds(torch, torch.float16, dtype, be, wrap)
        made._device = -1
        made._current_stream = lambda index: types.SimpleNamespace(native_handle=torch_stream.handle,
                                                                   cuda_stream=torch_stream.handle)
        return made

    monkeypatch.setattr(trtio._setups.base, "torch_embeds", reader)
    fed, plain = _setup(), _setup()
    owned = {phase: Tensor.empty(shape, "float16", Location.DEVICE, backend=host) for phase, shape in SHAPES.items()}
    buffers = {phase: _torch_over(t) for phase, t in owned.items()}
    addresses = {t.data_ptr for t in owned.values()}
    real = host.memcpy
    sources: list[int] = []

    def memcpy(dst: int, src: int, nbytes: int, stream: int) -> None:
        sources.append(src)
        real(dst, src, nbytes, stream)
    try:
        for r in range(3):
            for phase, t in owned.items():
                t.copy_from(_values(r, phase))
            if r == 2:
                counts.imports = counts.general = counts.wrapped = 0
                ordered.clear()
                monkeypatch.setattr(host, "memcpy", memcpy)
            got = _round(fed, buffers)
            monkeypatch.setattr(host, "memcpy", real)
            want = _round(plain, owned)
            for i, (g, w) in enumerate(zip(got, want)):
                np.testing.assert_array_equal(g, w, err_msg=f"round {r}, output {i}")
        assert (counts.imports, counts.general, counts.wrapped) == (0, 0, 0), "no capsule, no new Tensor"
        assert len(ordered) == STEPS + 2 and {p for p, _ in ordered} == {torch_stream.handle}, ordered
        assert addresses & set(sources), "copied from the torch tensors' own memory"
    finally:
        fed.close()
        plain.close()
        for t in owned.values():
            t.close()
        torch_stream.close()


@pytest.mark.gpu
def test_spec_phases_fed_torch_cuda_tensors_read_them_in_place_after_torchs_stream(counts: _Counts) -> None:
    """On the GPU's torch: each phase fed a torch CUDA buffer, written on torch's own stream just before the phase,
    gives the logits of the same phase fed numpy; after the first round no phase imports a capsule, takes the
    general path or wraps a new Tensor."""
    t = pytest.importorskip("torch")
    pytest.importorskip("cupy")
    from trtio._cuda.backend import cuda_available

    if not cuda_available():
        pytest.skip("no CUDA device answers here")
    fed, plain = _setup("gpu"), _setup("gpu")
    buffers = {phase: t.zeros(shape, dtype=t.float16, device="cuda") for phase, shape in SHAPES.items()}
    try:
        for r in range(3):
            for phase, x in buffers.items():
                x.copy_(t.from_numpy(_values(r, phase)).cuda(non_blocking=True))
            if r == 2:
                counts.imports = counts.general = counts.wrapped = 0
            got = _round(fed, buffers)
            want = _round(plain, {phase: _values(r, phase) for phase in SHAPES})
            for i, (g, w) in enumerate(zip(got, want)):
                np.testing.assert_allclose(g, w, atol=2e-3, rtol=2e-3, err_msg=f"round {r}, output {i}")
        assert (counts.imports, counts.general, counts.wrapped) == (0, 0, 0)
    finally:
        fed.close()
        plain.close()


@needs_torch
@pytest.mark.parametrize("bad, message", [
    (lambda x: torch._neg_view(x), "negative bit"),
    (lambda x: x.clone().requires_grad_(), "gradient"),
    (lambda x: x.transpose(0, 1).contiguous().transpose(0, 1), "strided"),
])
def test_a_torch_input_the_reader_passes_over_is_refused_by_name_before_any_work(
        host: Backend, bad: Callable[[Any], Any], message: str) -> None:
    """What the reader does not take (the negative bit, a gradient, a strided view) goes the general way, which
    refuses it naming the input, before any work; a float32 tensor is converted (host data) and gives the logits of
    the same values fed as float16."""
    sd, plain = _setup(), _setup()
    try:
        x = torch.from_numpy(_values(0, "verify"))
        ops = host.op_count
        with pytest.raises(trtio.TrtioError, match=message):
            sd.verify(bad(x), BINARY)
        assert host.op_count == ops, "nothing enqueued"
        np.testing.assert_array_equal(sd.verify(x.float(), BINARY).to_numpy(),
                                      plain.verify(_values(0, "verify"), BINARY).to_numpy())
    finally:
        sd.close()
        plain.close()


# -- a host numpy input: one copy, into a warm slot ---------------------------------------------------------------


def test_verify_fed_a_large_host_input_stages_one_copy_into_the_last_slot() -> None:
    """At 8B-class scale (a 60-node tree, batch 8: a 3.9 MB input), verify fed numpy again and again (the dry-run
    backend: every event complete) stages it through one slot, the last upload's (its bytes still in the host's
    caches; going round the ring's four slots writes 16 MB), and allocates nothing near the input's size (no second
    copy of it)."""
    from trtio._tools.bench import BATCH as B
    from trtio._tools.bench import HIDDEN, configs, null_engine
    from trtio._tools.bench import VERIFY as N
    from trtio._tools.dry_run import DryRunBackend

    class Recording(DryRunBackend):
        def __init__(self) -> None:
            super().__init__()
            self.copies: list[tuple[int, int]] = []

        def memcpy(self, dst: int, src: int, nbytes: int, stream: int) -> None:
            self.copies.append((dst, src))
            super().memcpy(dst, src, nbytes, stream)

    be = Recording()
    _llm, bundle = configs("batch", 256)
    assert bundle.draft is not None
    x = np.random.default_rng(0).standard_normal((B, N, HIDDEN)).astype(np.float16)
    binary = [-1] + [(i - 1) // 2 for i in range(1, N)]
    with trtio.create_for_spec_decode(null_engine(bundle.base, be), null_engine(bundle.draft, be), bundle,
                                      graphs=True, backend=be) as sd:
        prompt = np.zeros((B, 4, HIDDEN), np.float16)
        sd.base_prefill(prompt, np.full(B, 4))
        sd.draft_prefill(prompt, np.full(B, 4))
        sd.verify(x, binary)
        dst = sd.io.inputs_embeds.data_ptr
        be.copies.clear()
        tracemalloc.start()
        try:
            for _ in range(4):
                sd.verify(x, binary)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    sources = [src for d, src in be.copies if d == dst]
    assert len(sources) == 4 and len(set(sources)) == 1, f"one slot, the last upload's: {sources}"
    assert peak < x.nbytes // 8, f"{peak} bytes allocated by 4 verifies of a {x.nbytes}-byte input"
