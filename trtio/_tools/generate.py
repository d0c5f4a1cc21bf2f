"""``trtio generate``: text from an engine directory, greedily or speculatively, streamed as it is made.

The directory is one TensorRT Edge-LLM 0.11 writes (``config.json`` + ``llm.engine``, or ``base_config.json`` +
``draft_config.json`` + ``spec_base.engine`` + ``spec_draft.engine``) or one of trtio's batch-major toy folders
(``engines/toy-llm``, ``engines/toy-eagle``: a ``config.json`` DeploymentConfig, plans in ``model.plan`` files).
Beside the engines it holds what a runtime needs: ``tokenizer.json`` (read with Hugging Face ``tokenizers``,
the optional extra ``trtio[generate]``) and ``embedding.safetensors`` (the token embedding table, tensor
``"embedding"``). Without engine files (the toy directories) the engines are ReferenceEngines of the configs
computing the toy model with its seeded weights (:mod:`trtio.testing`), and a line on stderr says so.

The prompt is tokenized, its embeddings gathered on the device from the table, and tokens are chosen greedily
until an end-of-sequence token (``eos_token_id`` of the config, else ``eos_token`` of
``tokenizer_config.json``), ``--max-new-tokens`` or a full KV cache. A speculative pair drafts ``draft_top_k``
chains of ``draft_step`` tokens per round (the draft's top-k first tokens, then its greedy continuation of
each), verifies them all with the base in one step and keeps the longest chain the base agrees with, plus
the base's next token: exactly the tokens greedy decoding of the base gives (a DFlash / JetSpec pair guesses one
block a round; a Gemma 4 MTP pair's assistant drafts one chain of ``draft_step`` one-token steps, verified as it is
at top-K 1, or as the DDTree its steps' top-K tokens grow). Text goes to stdout as tokens
come; tokens per second (and for a pair the acceptance rate) to stderr at the end.

A vision-language model's directory (``visual/`` beside the LLM: Qwen2.5-VL, Qwen3-VL) takes ``--image``: each
image is preprocessed (:func:`trtio.vision.preprocess`), encoded by the directory's ViT (``setup.visual``) and
spliced into the prompt (:func:`trtio.vision.splice`): one image pad per image, wrapped in the vision markers
and put before the prompt's text unless the prompt holds its own pads; the prefill takes the spliced
embeddings, deepstack features and 3-axis MRoPE positions.

A speech model's directory (``audio/`` beside the LLM: Qwen3-ASR, Qwen3-Omni's thinker) takes ``--audio FILE.wav``:
each clip is read (:func:`trtio.audio.read_wav`: 16-bit PCM mono), preprocessed (:func:`trtio.audio.preprocess`:
the log-mel chunks and attention windows), encoded by the directory's audio encoder (``setup.audio``) and spliced
into the prompt (:func:`trtio.audio.splice`): one audio pad per clip, between the audio markers and before the
prompt's text unless the prompt holds its own pads; audio rows and text take sequential positions. ``--audio`` and
``--image`` together are refused: the positions Edge-LLM's runner gives audio and images in one prompt are not
implemented.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from trtio._config import DeploymentConfig, LLMEngineConfig
from trtio._embeddings import TokenEmbeddings
from trtio._lifetime import Closeable
from trtio._safetensors import read_safetensors
from trtio._setups import (
    LLMSetup,
    SpecDecodeSetup,
    create_for_llm,
    create_for_spec_decode,
    create_from_engine_dir,
)
from trtio._setups.tensor_parallel import TensorParallelLLMSetup
from trtio._stream import Stream
from trtio._tensor import Tensor
from trtio._tools.engine_dirs import RUNTIME_FLAGS, edgellm_directory
from trtio._tools.options import backend_option
from trtio._trt import load_engine
from trtio.audio import AudioFeatures, AudioPrompt, read_wav
from trtio.audio import preprocess as preprocess_audio
from trtio.audio import splice as splice_audio
from trtio.components.visual.visual_setup import create_for_visual
from trtio.edgellm import CONFIG_FILES, EMBEDDING_FILE, EngineDir
from trtio.errors import ConfigError, ShapeError, TrtioError
from trtio.families.gemma4_mtp.ddtree import ddtree
from trtio.families.gemma4_mtp.gemma4_mtp_config import Gemma4MtpConfig
from trtio.families.hybrid.hybrid_config import HybridConfig
from trtio.families.lora.adapters import LoraAdapter
from trtio.families.spec.block_family import block_family_of
from trtio.families.spec.dflash_bindings import block_size, mask_token
from trtio.families.spec.spec_config import SpecConfig
from trtio.testing.toy_model import ToyWeights
from trtio.vision import preprocess, splice

__all__ = ["GenerateOptions", "TOKENIZER_FILE", "TOKENIZER_CONFIG_FILE", "run_generate"]

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
_PLAN = "model.plan"  # trtio's toy folders: a plan beside each engine's config


@dataclass(frozen=True)
class GenerateOptions:
    """What ``trtio generate`` takes (its command-line options)."""

    path: Path
    prompt: str
    max_new_tokens: int = 32
    speculative: bool = False
    draft_top_k: int | None = None
    draft_step: int | None = None
    backend: str = "auto"
    images: tuple[Path, ...] = ()
    audio: tuple[Path, ...] = ()  # 16-bit PCM mono WAV clips for a speech model's directory
    lora: Path | None = None  # a LoRA adapter (trtio.LoraAdapter.load) for a LoRA engine's directory


@dataclass
class _Model:
    """A directory opened for generation: its setup, embedding table, draft-to-target map and end tokens."""

    setup: LLMSetup | TensorParallelLLMSetup | SpecDecodeSetup
    table: np.ndarray  # float16 [vocab, hidden]
    eos: frozenset[int]
    draft_to_target: np.ndarray | None
    note: str | None  # why the engines are ReferenceEngines, where they are
    directory: EngineDir | None = None  # an Edge-LLM directory (EngineDir.embeddings); None: a toy folder


def run_generate(opts: GenerateOptions, out: TextIO | None = None, err: TextIO | None = None) -> dict[str, Any]:
    """Generate from ``opts.prompt`` in ``opts.path``, streaming the text to ``out`` (default stdout) and the
    closing statistics to ``err`` (default stderr); returns them (``tokens``, ``seconds``, ``tokens_per_second``,
    ``stopped``, and for a pair ``rounds``, ``drafted``, ``accepted``, ``acceptance_rate``,
    ``accepted_per_verify``)."""
    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err
    path = Path(opts.path)
    if opts.backend != "auto":
        backend_option(opts.backend)  # a backend this machine lacks: the option's error, before anything is read
    if not path.is_dir():
        raise ConfigError(str(path), "no such engine directory" if not path.exists() else "is not a directory")
    kind = _directory_kind(path)
    for name in (TOKENIZER_FILE, EMBEDDING_FILE):
        if not (path / name).is_file():
            raise ConfigError(str(path / name), f"no such file; trtio generate needs the directory's {TOKENIZER_FILE} "
                                                f"and {EMBEDDING_FILE}")
    tokenizer = _tokenizer(path)
    ids = tokenizer.encode(opts.prompt).ids
    if not ids:
        raise ShapeError(f"--prompt: {opts.prompt!r} has no tokens")
    clips = _clips(path, kind, opts)  # refuses --audio beside --image first
    images = _images(path, kind, opts)
    adapter = _adapter(path, opts.lora) if opts.lora is not None else None  # a bad file: before any engine
    model = _open(path, kind, opts)
    with model.setup as setup:
        if adapter is not None:
            if not isinstance(setup, LLMSetup):
                raise ConfigError("--lora", f"{path} is a {type(setup).__name__}'s directory; LoRA adapters are set "
                                            "on a plain LLM's (LLMSetup.set_lora)")
            setup.set_lora(adapter)
        limit = (setup.base.cfg if isinstance(setup, SpecDecodeSetup) else setup.cfg).max_supported_input_length
        prompt: Any = None  # a VisionPrompt, an encoder kind's prompt (ImagePrompt) or an AudioPrompt
        if images:
            assert isinstance(setup, LLMSetup) and setup.visual is not None
            prompt = _vision_prompt(setup, model.table, ids, images)
            ids = [int(t) for t in prompt.token_ids[0]]
        if clips:
            assert isinstance(setup, LLMSetup) and setup.audio is not None
            prompt = _audio_prompt(setup, model.table, ids, clips)
            ids = [int(t) for t in prompt.token_ids[0]]
        if len(ids) > limit:
            what = "--prompt and --image" if images else "--prompt and --audio" if clips else "--prompt"
            raise ShapeError(f"{what}: {len(ids)} tokens, more than the engine takes in one prefill "
                             f"(max_supported_input_length {limit})")
        if model.note:
            print(f"trtio generate: {model.note}", file=err, flush=True)
        text = _TextStream(tokenizer, out)
        out.write(opts.prompt)
        out.flush()
        sink = _Sink(text.push, model.eos, opts.max_new_tokens)
        embed = _DeviceEmbedding(model, setup)
        try:
            start = time.perf_counter()
            if isinstance(setup, SpecDecodeSetup):
                stats = _speculative(setup, embed, ids, sink, opts.speculative, model.draft_to_target)
            else:
                stats = _greedy(setup, embed, ids, sink, prompt)
            seconds = time.perf_counter() - start
        finally:
            embed.close()
        text.end()
    result: dict[str, Any] = {"tokens": sink.count, "seconds": seconds,
                              "tokens_per_second": sink.count / max(seconds, 1e-9), "stopped": sink.stopped, **stats}
    line = f"trtio generate: {sink.count} tokens in {seconds:.3f} s, {result['tokens_per_second']:.1f} tokens/s"
    if opts.speculative:
        line += (f"; {result['rounds']} verify steps, {result['acceptance_rate']:.0%} of drafted tokens accepted, "
                 f"{result['accepted_per_verify']:.2f} accepted tokens per verify")
    if sink.stopped:
        line += f" (stopped: {sink.stopped})"
    print(line, file=err, flush=True)
    return result


# -- opening a directory ----------------------------------------------------------------------------


def _adapter(path: Path, lora: Path) -> LoraAdapter:
    """``--lora``: a path, or the name of one of the directory's own adapters (``adapters/<name>``: the toys')."""
    own = path / "adapters" / lora
    if not lora.exists() and len(lora.parts) == 1 and own.is_dir():
        return LoraAdapter.load(own)
    return LoraAdapter.load(lora)


def _directory_kind(path: Path) -> str:
    """``"edgellm"`` for Edge-LLM's layout, ``"trtio"`` for one of trtio's toy folders."""
    if edgellm_directory(path) is not None:
        return "edgellm"
    config = path / CONFIG_FILES["llm"]
    if config.is_file():
        try:
            data = json.loads(config.read_bytes())
        except (OSError, ValueError):
            data = None
        if isinstance(data, dict) and "base" in data:
            return "trtio"
    raise ConfigError(str(path), "holds no engine config: expected an Edge-LLM engine directory (config.json, or "
                                 "base_config.json + draft_config.json) or a trtio toy folder (config.json with base)")


def _tokenizer(path: Path) -> Any:
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise TrtioError("trtio generate needs Hugging Face tokenizers to read tokenizer.json: "
                         "pip install 'trtio[generate]'") from None
    try:
        return Tokenizer.from_file(str(path / TOKENIZER_FILE))
    except Exception as exc:  # tokenizers raises its own Exception type for a malformed file
        raise ConfigError(str(path / TOKENIZER_FILE), f"cannot be read by tokenizers: {exc}") from None


def _open(path: Path, kind: str, opts: GenerateOptions) -> _Model:
    if kind == "edgellm":
        model = _open_edgellm(path, opts)
        model.directory = EngineDir.open(path)
        return model
    return _open_trtio(path, opts)


def _open_edgellm(path: Path, opts: GenerateOptions) -> _Model:
    directory = EngineDir.open(path)
    pair = directory.kind == "spec_decode"
    _check_mode(path, pair, opts)
    role = "base" if pair else "llm"
    eos = _eos(directory.raw(role).get("eos_token_id"), path)
    table = np.asarray(directory.embedding_table())
    if not pair:
        if directory.has_engines:
            return _Model(create_from_engine_dir(path, graphs=True, backend=_backend(opts)), table, eos, None, None)
        if directory.visual_config is not None:
            return _Model(_reference_vlm(directory, opts), table, eos, None, _reference_note(path))
        if directory.is_tensor_parallel:
            if opts.backend == "cuda":
                raise ConfigError("--backend", f"cuda needs engine files; {path} has none, and its reference ranks "
                                               "run on the host backend only (--backend host or auto)")
            return _Model(_reference_ranks(directory), table, eos, None, _reference_note(path, ranks=True))
        cfg = directory.config
        engine = _reference(cfg, ToyWeights.generate(cfg, 0), opts)
        return _Model(create_for_llm(engine, cfg, graphs=True, backend=_backend(opts)), table, eos, None,
                      _reference_note(path))
    base, draft = directory.base_config, directory.draft_config
    k, depth = _tree(base, draft, opts)
    if directory.has_engines:
        setup = create_from_engine_dir(path, graphs=True, draft_top_k=k, draft_step=depth, verify_size=1 + k * depth,
                                       backend=_backend(opts))
        note = None
    else:
        bundle = directory.deployment(k, depth, 1 + k * depth)
        weights = ToyWeights.generate(base, 0)
        draft_weights = ToyWeights.generate_draft(draft, weights, 0) if not _is_dflash(bundle) else \
            ToyWeights.generate_dflash_draft(draft, weights, table, mask_token(draft.extras), 0, base_cfg=base)
        setup = create_for_spec_decode(_reference(base, weights, opts), _reference(draft, draft_weights, opts), bundle,
                                       graphs=True, backend=_backend(opts))
        note = _reference_note(path)
    return _Model(setup, table, eos, directory.draft_to_target(), note)


def _open_trtio(path: Path, opts: GenerateOptions) -> _Model:
    deployment = DeploymentConfig.from_json(path / CONFIG_FILES["llm"])
    seed = int(deployment.extra.get("seed", 0))
    base = deployment.base
    pair = deployment.draft is not None
    _check_mode(path, pair, opts)
    table = _embedding_file(path / EMBEDDING_FILE, base)
    eos = _eos(_tokenizer_eos(path), path)
    weights = ToyWeights.generate(base, seed)
    if not pair:
        plan = path / _PLAN
        if plan.is_file():
            return _Model(create_for_llm(load_engine(plan), base, graphs=True, backend=_backend(opts)), table, eos,
                          None, None)
        return _Model(create_for_llm(_reference(base, weights, opts), base, graphs=True, backend=_backend(opts)), table,
                      eos, None, _reference_note(path))
    draft = deployment.draft
    assert draft is not None and deployment.spec is not None
    k, depth = _tree(base, draft, opts)
    bundle = DeploymentConfig(base, draft, dataclasses.replace(
        deployment.spec, drafting_top_k=k, drafting_step=depth, verify_size=1 + k * depth)).validate()
    plans = [path / role / _PLAN for role in ("base", "draft")]
    if all(p.is_file() for p in plans):
        engines = [load_engine(p) for p in plans]
        note = None
    else:
        engines = [_reference(base, weights, opts),
                   _reference(draft, ToyWeights.generate_draft(draft, weights, seed), opts)]
        note = _reference_note(path)
    setup = create_for_spec_decode(engines[0], engines[1], bundle, graphs=True, backend=_backend(opts))
    return _Model(setup, table, eos, None, note)


def _check_mode(path: Path, pair: bool, opts: GenerateOptions) -> None:
    if opts.speculative and not pair:
        raise ConfigError("--speculative", f"needs a speculative pair (base and draft engines); {path} holds a plain "
                                           "LLM")
    for flag, value in ((RUNTIME_FLAGS["draft_top_k"], opts.draft_top_k),
                        (RUNTIME_FLAGS["draft_step"], opts.draft_step)):
        if value is not None and not pair:
            raise ConfigError(flag, f"is for a speculative pair; {path} holds a plain LLM")
        if value is not None and not opts.speculative:
            raise ConfigError(flag, "shapes the draft tree of --speculative decoding; without --speculative the "
                                    "pair decodes greedily through the base alone (add --speculative)")


def _tree(base: LLMEngineConfig, draft: LLMEngineConfig, opts: GenerateOptions) -> tuple[int, int]:
    """(chains, tokens per chain) of a round's draft tree: ``--draft-top-k`` (default 1) and ``--draft-step``
    (default: the longest chains the engines' tree caps allow). Verified whole: 1 + k x step nodes. Without
    ``--speculative`` the pair decodes greedily through the base alone (verify steps of one node)."""
    if not opts.speculative:
        return 1, 1
    k = 1 if opts.draft_top_k is None else opts.draft_top_k
    if block_family_of(draft.extras) is not None:  # one block a round: the root and block - 1 guesses
        if k > 1:
            raise ConfigError(RUNTIME_FLAGS["draft_top_k"], f"is {k}, but a block draft (DFlash, JetSpec) guesses one "
                                                            "block (one chain) a round; use 1")
        block = block_size(draft.extras, min(draft.max_draft_tree_size, base.max_verify_tree_size))
        depth = block - 1 if opts.draft_step is None else opts.draft_step
        if not 1 <= depth <= block - 1:
            raise ConfigError(RUNTIME_FLAGS["draft_step"], f"is {depth}: a DFlash block of {block} guesses 1.."
                                                           f"{block - 1} tokens a round")
        return 1, depth
    if k > 1 and base.feature(HybridConfig) is not None:
        raise ConfigError(RUNTIME_FLAGS["draft_top_k"], f"is {k}, but a hybrid base verifies one chain per round (its "
                                                        "recurrent layers run a step's tokens in order); use 1")
    cap = min(draft.max_draft_tree_size, base.max_verify_tree_size - 1)  # draft nodes a round may have
    # The longest chains that fit: the rows a draft step takes (draft_rows: an EAGLE-style tree's k x depth, or its
    # family's) within the draft's cap, the verify tree (1 + k x depth) within the base's.
    room = max((d for d in range(1, base.max_verify_tree_size) if 1 + k * d <= base.max_verify_tree_size and
                draft.draft_rows(k, d) <= draft.max_draft_tree_size), default=0)
    if room == 0:
        raise ConfigError(RUNTIME_FLAGS["draft_top_k"],
                          f"{k} chains of at least 1 token need a draft tree of {k} nodes and a verify tree of "
                          f"{1 + k}, but the draft takes {draft.max_draft_tree_size} and the base "
                          f"{base.max_verify_tree_size}: at most {cap} chains")
    depth = room if opts.draft_step is None else opts.draft_step
    if depth < 1 or draft.draft_rows(k, depth) > draft.max_draft_tree_size or 1 + k * depth > base.max_verify_tree_size:
        raise ConfigError(RUNTIME_FLAGS["draft_step"] if opts.draft_step is not None else RUNTIME_FLAGS["draft_top_k"],
                          f"{k} chains of {depth} tokens need a draft tree of {k * depth} nodes (the draft takes "
                          f"{draft.max_draft_tree_size}) and a verify tree of {1 + k * depth} (the base takes "
                          f"{base.max_verify_tree_size})")
    return k, depth


def _backend(opts: GenerateOptions) -> str | None:
    return None if opts.backend == "auto" else opts.backend


def _reference(cfg: LLMEngineConfig, weights: ToyWeights, opts: GenerateOptions) -> Any:
    from trtio.testing.reference_engine import ReferenceEngine  # noqa: PLC0415 - heavy, loaded on use

    device = {"auto": "auto", "host": "host", "cuda": "gpu"}[opts.backend]
    return ReferenceEngine.from_config(cfg, weights=weights, device=device)


def _reference_vlm(directory: EngineDir, opts: GenerateOptions) -> LLMSetup:
    """A vision-language model's directory without engine files: the LLM and its ViT as ReferenceEngines of their
    configs (the toy models' seeded weights), the ViT attached as ``setup.visual``."""
    from trtio.testing.reference_visual import ReferenceVisualEngine, VitWeights  # noqa: PLC0415 - heavy

    vcfg = directory.visual_config
    assert vcfg is not None
    cfg = directory.config
    setup = create_for_llm(_reference(cfg, ToyWeights.generate(cfg, 0), opts), cfg, graphs=True)
    try:
        vit = ReferenceVisualEngine.from_config(vcfg, weights=VitWeights.generate(vcfg, 0), device=opts.backend)
        setup.attach_visual(create_for_visual(vit, vcfg, graphs=True, backend=setup.io.backend))
    except BaseException:
        setup.close()
        raise
    return setup


def _images(path: Path, kind: str, opts: GenerateOptions) -> list[np.ndarray]:
    """The ``--image`` files as uint8 RGB arrays (refused for a directory without a vision encoder)."""
    if not opts.images:
        return []
    if kind != "edgellm" or EngineDir.open(path).visual_config is None:
        raise ConfigError("--image", f"{path} has no vision encoder (a vision-language model's directory holds "
                                     "visual/config.json beside the LLM)")
    return [_read_image(Path(p)) for p in opts.images]


def _read_image(file: Path) -> np.ndarray:
    """An image file as uint8 ``[H, W, 3]``: a ``.npy`` array as it is, anything else through Pillow (RGB)."""
    if not file.is_file():
        raise ConfigError(f"--image {file}", "no such file")
    if file.suffix.lower() == ".npy":
        try:
            return np.asarray(np.load(file, allow_pickle=False))
        except (OSError, ValueError) as exc:
            raise ConfigError(f"--image {file}", f"cannot be read as a numpy array: {exc}") from None
    try:
        from PIL import Image
    except ImportError:
        raise TrtioError("trtio generate --image needs Pillow to read PNG or JPEG files: pip install 'trtio[vision]' "
                         "(or pass a .npy uint8 [H, W, 3] array)") from None
    try:
        with Image.open(file) as img:
            return np.asarray(img.convert("RGB"))
    except OSError as exc:
        raise ConfigError(f"--image {file}", f"cannot be read as an image: {exc}") from None


def _vision_prompt(setup: LLMSetup, table: np.ndarray, ids: list[int], images: list[np.ndarray]) -> Any:
    """The prompt with ``images`` spliced in: each image preprocessed and encoded by the setup's ViT; one image pad
    per image (wrapped in the vision markers where the encoder's config has them, before the text) unless the prompt
    holds its own pads. A :class:`~trtio.vision.VisionPrompt`, or the prompt of the encoder's kind (the splice of an
    InternVL encoder wraps each image in ``<img>`` / ``</img>`` itself and gives 1-D positions)."""
    visual = setup.visual
    assert visual is not None
    vcfg = visual.cfg
    if vcfg.image_token_id not in ids:
        marker: list[int] = []
        start, end = getattr(vcfg, "vision_start_token_id", None), getattr(vcfg, "vision_end_token_id", None)
        for _ in images:
            marker += [t for t in (start, vcfg.image_token_id, end) if t is not None]
        ids = marker + ids
    patches, grid = preprocess(images, vcfg)
    encoded = visual.encode(patches, grid)
    return splice(ids, grid, vcfg, table, encoded)


def _clips(path: Path, kind: str, opts: GenerateOptions) -> list[AudioFeatures]:
    """The ``--audio`` files read and preprocessed with the directory's audio encoder config, before any engine is
    loaded (refused for a directory without an audio encoder or its engine files, and beside ``--image``)."""
    if not opts.audio:
        return []
    if opts.images:
        raise ConfigError("--audio", "given with --image: the positions Edge-LLM's runner gives audio and images in "
                                     "one prompt (Qwen3-Omni's TM-RoPE) are not implemented; pass one or the other")
    directory = EngineDir.open(path) if kind == "edgellm" else None
    cfg = directory.audio_config if directory is not None else None
    if directory is None or cfg is None:
        raise ConfigError("--audio", f"{path} has no audio encoder (a speech model's directory holds "
                                     "audio/config.json beside the LLM)")
    if not directory.has_engines:
        missing = [str(p) for p in directory.engine_paths if not p.is_file()]
        raise ConfigError("--audio", f"needs the directory's engine files; {path} lacks {', '.join(missing)} (trtio "
                                     "has no reference audio encoder to run in their place)")
    out = []
    for file in opts.audio:
        if not Path(file).is_file():
            raise ConfigError(f"--audio {file}", "no such file")
        samples, rate = read_wav(file)
        out.append(preprocess_audio(samples, rate, cfg))
    return out


def _audio_prompt(setup: LLMSetup, table: np.ndarray, ids: list[int], clips: list[AudioFeatures]) -> AudioPrompt:
    """The prompt with ``clips`` spliced in: each clip encoded by the setup's audio encoder; one audio pad per clip
    (between the audio markers, before the text) unless the prompt holds its own pads."""
    audio = setup.audio
    assert audio is not None
    cfg = audio.cfg
    if cfg.audio_token_id not in ids:
        marker: list[int] = []
        for _ in clips:
            marker += [t for t in (cfg.audio_start_token_id, cfg.audio_token_id, cfg.audio_end_token_id)
                       if t is not None]
        ids = marker + ids
    # each clip's rows copied out before the next encode reuses the encoder's output buffer
    rows = [audio.encode(features).to_numpy() for features in clips]
    return splice_audio(ids, cfg, table, rows)


def _reference_ranks(directory: EngineDir) -> TensorParallelLLMSetup:
    """A tensor-parallel directory without engine files: its ranks as ReferenceEngines on the host backend (each
    its share of the toy model, all-reducing in process), bound as ``create_from_engine_dir`` binds rank engines,
    with the checkpoint's weight inputs."""
    from trtio._setups.tensor_parallel import RankSpec  # noqa: PLC0415 - TP only
    from trtio.testing.toy_engines import TensorParallelToyEngines  # noqa: PLC0415 - heavy, loaded on use

    toys = TensorParallelToyEngines(directory)
    weights = directory.checkpoint_weights()
    specs = [RankSpec(directory.rank_config(r), r, functools.partial(toys.reference_engine, r), weights[r])
             for r in range(directory.tp_size)]
    return TensorParallelLLMSetup(directory.config, specs, backend="host", graphs=True)


def _reference_note(path: Path, *, ranks: bool = False) -> str:
    what = "its ranks as ReferenceEngines on the host backend (in-process all-reduce)" if ranks else \
        "ReferenceEngines of its configs"
    return f"{path} has no engine files: running {what} with the toy model's seeded weights (trtio.testing)"


def _eos(value: Any, path: Path) -> frozenset[int]:
    if value is None:
        return frozenset()
    values = value if isinstance(value, list) else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise ConfigError(f"{path}: eos_token_id", f"expected a token id or a list of them, got {value!r}")
    return frozenset(values)


def _tokenizer_eos(path: Path) -> int | None:
    """The id of ``eos_token`` in ``tokenizer_config.json`` (None without the file or the key)."""
    file = path / TOKENIZER_CONFIG_FILE
    if not file.is_file():
        return None
    try:
        token = json.loads(file.read_bytes()).get("eos_token")
    except (OSError, ValueError, AttributeError):
        raise ConfigError(str(file), "is not a JSON object") from None
    if isinstance(token, dict):  # {"content": "</s>", ...}
        token = token.get("content")
    if not isinstance(token, str):
        return None
    found: int | None = _tokenizer(path).token_to_id(token)
    return found


def _embedding_file(file: Path, cfg: LLMEngineConfig) -> np.ndarray:
    """The table of a trtio toy folder: tensor ``"embedding"``, F16 or F32 ``[vocab_size, hidden_size]``."""
    table = read_safetensors(file, ["embedding"])["embedding"]
    want = (cfg.vocab_size, cfg.hidden_size)
    if table.dtype not in ("F16", "F32") or table.array.shape != want:
        raise ConfigError(f"{file}: embedding", f"expected F16 or F32 {list(want)} (vocab_size, hidden_size), got "
                                                f"{table.dtype} {list(table.array.shape)}")
    return table.array.astype(np.float16)


# -- generation -------------------------------------------------------------------------------------


class _DeviceEmbedding(Closeable):
    """The directory's embedding tables on the setup's device (an Edge-LLM directory's
    :meth:`~trtio.edgellm.EngineDir.embeddings`; a toy folder's table in a :class:`~trtio._embeddings.TokenEmbeddings`):
    a prompt's or a token's rows gathered on the setup's stream, into buffers each step reads on that stream before
    the next gather writes. :meth:`extras` are the step's other embedding inputs (Gemma 4's ``ple_embeds``)."""

    def __init__(self, model: _Model, setup: LLMSetup | TensorParallelLLMSetup | SpecDecodeSetup) -> None:
        self._init_lifetime("embedding table")
        self._backend = setup.io.backend
        self._stream = Stream.default(self._backend)  # the setups here were made with stream=None: steps run on it
        rows = max(setup.io.inputs_embeds.capacity // (model.table.shape[1] * 2), 1)
        if model.directory is not None:
            self._tokens = model.directory.embeddings(self._backend, self._stream, max_tokens=rows)
        else:
            self._tokens = TokenEmbeddings(model.table, max_tokens=rows, backend=self._backend, stream=self._stream)
        self._ple: Tensor | None = None

    def __call__(self, tokens: Sequence[int]) -> Tensor:
        """[1, len(tokens), hidden]: the rows of ``tokens``, gathered on the setup's stream."""
        out = self._tokens.embed(np.asarray([list(tokens)], np.int64), stream=self._stream)
        if isinstance(out, tuple):
            self._ple = out[1]
            return out[0]
        return out

    def extras(self) -> dict[str, Any]:
        """The last gather's per-layer embeddings as a step's ``ple_embeds=`` (nothing without a PLE table)."""
        return {} if self._ple is None else {"ple_embeds": self._ple}

    def _close_owned(self) -> None:
        self._tokens.close()


class _Sink:
    """Takes generated tokens until an end-of-sequence token or the limit; counts and streams them."""

    def __init__(self, emit: Callable[[list[int]], None], eos: frozenset[int], limit: int) -> None:
        self._emit = emit
        self._eos = eos
        self._limit = limit
        self.count = 0
        self.stopped = ""

    def take(self, tokens: Sequence[int]) -> bool:
        """Stream ``tokens`` in order; True once generation must end (the tokens after that are dropped)."""
        for token in tokens:
            if token in self._eos:
                self.stopped = "end of sequence"
                return True
            self._emit([int(token)])
            self.count += 1
            if self.count >= self._limit:
                return True
        return False


def _greedy(setup: LLMSetup | TensorParallelLLMSetup, embed: _DeviceEmbedding, ids: list[int], sink: _Sink,
            prompt: Any = None) -> dict[str, Any]:
    cap = setup.cfg.max_kv_cache_capacity
    if prompt is None:
        logits = setup.prefill(embed(ids), [len(ids)], **embed.extras())
    elif isinstance(prompt, AudioPrompt):
        # audio rows and text take sequential positions: the rows a prefill given no positions writes
        logits = setup.prefill(prompt.inputs_embeds, prompt.context_lengths)
    else:
        logits = setup.prefill(prompt.inputs_embeds, prompt.context_lengths,
                               deepstack_embeds=list(getattr(prompt, "deepstack_embeds", ())) or None,
                               mrope_positions=getattr(prompt, "mrope_positions", None))
    while True:
        token = int(logits.to_numpy().argmax(-1)[0])
        if sink.take([token]):
            break
        if int(setup.lengths[0]) >= cap:
            sink.stopped = f"the KV cache holds max_kv_cache_capacity ({cap}) tokens"
            break
        logits = setup.decode(embed([token]), **embed.extras())
    return {}


def _speculative(setup: SpecDecodeSetup, embed: _DeviceEmbedding, ids: list[int], sink: _Sink, drafting: bool,
                 d2t: np.ndarray | None) -> dict[str, Any]:
    """Rounds of: draft ``k`` chains of ``depth`` tokens, verify them with the base, keep the longest chain the
    base agrees with plus the base's next token (module docstring). Without ``drafting`` each verify has one
    node: plain greedy decoding by the base."""
    spec = setup.bundle.spec
    assert spec is not None
    if drafting and _is_dflash(setup.bundle):
        return _speculative_blocks(setup, embed, ids, sink, spec.drafting_step + 1, d2t)
    if drafting and _is_assistant(setup.bundle):
        return _speculative_assistant(setup, embed, ids, sink, spec.drafting_top_k, spec.drafting_step)
    k, depth = (spec.drafting_top_k, spec.drafting_step) if drafting else (1, 0)
    # The verify tree: node 0 is the pending token; draft node j (level j // k, chain j % k) is node j + 1.
    parents = np.array([-1] + [0 if j < k else j - k + 1 for j in range(k * depth)], np.int64)
    depth_of = np.array([0] + [j // k + 1 for j in range(k * depth)])
    base_cap, draft_cap = setup.base.cfg.max_kv_cache_capacity, setup.draft.cfg.max_kv_cache_capacity
    pending = int(setup.base_prefill(embed(ids), [len(ids)], **embed.extras()).to_numpy().argmax(-1)[0])
    if drafting:
        draft_logits = setup.draft_prefill(embed(ids[1:] + [pending]), [len(ids)]).to_numpy()
    rounds = accepted = 0
    stop = sink.take([pending])
    while not stop:
        if int(setup.base_lengths[0]) + len(parents) > base_cap or \
                (drafting and int(setup.draft_lengths[0]) + k * depth > draft_cap):
            sink.stopped = "the KV cache is full"
            break
        tokens = [pending]
        if drafting:
            level = _top(draft_logits[0], k, d2t)
            tokens += level
            for n in range(1, depth):  # the draft reads level n - 1 (joining its tree) and proposes level n
                par = np.full(k, -1) if n == 1 else np.arange(k) + (n - 2) * k
                level = [int(t) for t in _map(setup.draft_propose(embed(level), parents=par).to_numpy().argmax(-1),
                                              d2t)]
                tokens += level
        greedy = setup.verify(embed(tokens), parents, **embed.extras()).to_numpy().argmax(-1)
        ok = np.zeros(len(tokens), bool)
        ok[0] = True
        for node in range(1, len(tokens)):  # a node is accepted when its parent is and the base chose its token
            ok[node] = ok[parents[node]] and tokens[node] == greedy[parents[node]]
        best = int(np.argmax(np.where(ok, depth_of, -1)))
        path = [best]
        while path[-1] != 0:
            path.append(int(parents[path[-1]]))
        path.reverse()
        setup.accept([path])
        emitted = [tokens[n] for n in path[1:]] + [int(greedy[best])]
        rounds += 1
        accepted += len(path) - 1
        stop = sink.take(emitted)
        pending = emitted[-1]
        if drafting and not stop:
            draft_logits = setup.draft_accept(embed(emitted), [len(path)]).to_numpy()
    drafted = rounds * k * depth
    return {"rounds": rounds, "drafted": drafted, "accepted": accepted,
            "acceptance_rate": accepted / drafted if drafted else 0.0,
            "accepted_per_verify": accepted / rounds if rounds else 0.0}


def _accepted_path(tokens: list[int], parents: list[int], greedy: np.ndarray) -> list[int]:
    """The longest root path of a verify tree the base agrees with: from the root, the child whose token is the
    base's greedy token after its parent, while there is one."""
    path = [0]
    while True:
        kids = [n for n in range(1, len(tokens)) if parents[n] == path[-1] and tokens[n] == int(greedy[path[-1]])]
        if not kids:
            return path
        path.append(kids[0])


def _assistant_tree(steps: np.ndarray, k: int, verify_size: int) -> tuple[list[int], list[int]]:
    """The draft nodes (tokens, parents; the root is node 0) a round of assistant steps ``steps`` [depth, vocab]
    proposes: the chain of their argmaxes (top-K 1), or Edge-LLM's DDTree of ``verify_size`` nodes (top-K > 1)."""
    if k > 1:
        return ddtree(steps, k, verify_size)
    return [int(t) for t in steps.argmax(-1)], list(range(steps.shape[0]))


def _speculative_assistant(setup: SpecDecodeSetup, embed: _DeviceEmbedding, ids: list[int], sink: _Sink, k: int,
                           depth: int) -> dict[str, Any]:
    """Gemma 4 MTP rounds (``trtio.families.gemma4_mtp``): the assistant's step 0 takes the pending token alone
    (``draft_prefill`` after the prompt, ``draft_accept`` after an accept), then ``depth - 1`` steps each fed the last
    step's argmax (``draft_propose``); the base verifies the pending token and that chain (top-K 1) or the DDTree its
    steps' top-``k`` tokens grow (top-K > 1, ``verify_size`` nodes); the longest agreeing path is kept with the base's
    next token."""
    spec = setup.bundle.spec
    assert spec is not None
    cap = setup.base.cfg.max_kv_cache_capacity
    pending = int(setup.base_prefill(embed(ids), [len(ids)], **embed.extras()).to_numpy().argmax(-1)[0])
    stop = sink.take([pending])
    rounds = accepted = drafted = 0
    if not stop:
        step = setup.draft_prefill(embed([pending]), [len(ids)]).to_numpy()[0]
    while not stop:
        if int(setup.base_lengths[0]) + (spec.verify_size if k > 1 else depth + 1) > cap:
            sink.stopped = "the KV cache is full"
            break
        steps = [step]
        for _ in range(1, depth):
            steps.append(setup.draft_propose(embed([int(steps[-1].argmax())])).to_numpy()[0])
        nodes, up = _assistant_tree(np.stack(steps), k, spec.verify_size)
        tokens, parents = [pending, *nodes], [-1, *up]
        greedy = setup.verify(embed(tokens), np.array(parents), **embed.extras()).to_numpy().argmax(-1)
        path = _accepted_path(tokens, parents, greedy)
        setup.accept([path])
        emitted = [tokens[n] for n in path[1:]] + [int(greedy[path[-1]])]
        rounds, accepted, drafted = rounds + 1, accepted + len(path) - 1, drafted + len(nodes)
        stop = sink.take(emitted)
        pending = emitted[-1]
        if not stop:
            step = setup.draft_accept(embed([pending]), [len(path)]).to_numpy()[0]
    return {"rounds": rounds, "drafted": drafted, "accepted": accepted,
            "acceptance_rate": accepted / drafted if drafted else 0.0,
            "accepted_per_verify": accepted / rounds if rounds else 0.0}


def _speculative_blocks(setup: SpecDecodeSetup, embed: _DeviceEmbedding, ids: list[int], sink: _Sink, width: int,
                        d2t: np.ndarray | None) -> dict[str, Any]:
    """DFlash rounds (``trtio.families.spec.dflash``): the draft guesses a block (the pending token, then mask tokens)
    after each prefill or accept; the base verifies the pending token and the guesses as one chain; the longest
    agreeing prefix is kept with the base's next token."""
    assert setup.bundle.draft is not None
    mask = [mask_token(setup.bundle.draft.extras)] * (width - 1)
    chain = list(range(-1, width - 1))
    base_cap, draft_cap = setup.base.cfg.max_kv_cache_capacity, setup.draft.cfg.max_kv_cache_capacity
    pending = int(setup.base_prefill(embed(ids), [len(ids)]).to_numpy().argmax(-1)[0])
    draft_logits = setup.draft_prefill(embed([pending, *mask]), [len(ids)]).to_numpy()
    rounds = accepted = 0
    stop = sink.take([pending])
    while not stop:
        if int(setup.base_lengths[0]) + width > base_cap or int(setup.draft_lengths[0]) + 2 * width > draft_cap:
            sink.stopped = "the KV cache is full"
            break
        tokens = [pending, *_map(draft_logits[1:].argmax(-1), d2t).tolist()]  # row j guesses its own position
        greedy = setup.verify(embed(tokens), chain).to_numpy().argmax(-1)
        n = 1
        while n < width and tokens[n] == greedy[n - 1]:
            n += 1
        setup.accept([list(range(n))])
        emitted = [*tokens[1:n], int(greedy[n - 1])]
        rounds += 1
        accepted += n - 1
        stop = sink.take(emitted)
        pending = emitted[-1]
        if not stop:
            draft_logits = setup.draft_accept(embed([pending, *mask]), [n]).to_numpy()
    drafted = rounds * (width - 1)
    return {"rounds": rounds, "drafted": drafted, "accepted": accepted,
            "acceptance_rate": accepted / drafted if drafted else 0.0,
            "accepted_per_verify": accepted / rounds if rounds else 0.0}


def _map(columns: np.ndarray, d2t: np.ndarray | None) -> np.ndarray:
    return columns if d2t is None else d2t[columns]


def _top(logits: np.ndarray, k: int, d2t: np.ndarray | None) -> list[int]:
    """The ``k`` best tokens of one row of draft logits, best first."""
    columns = np.argsort(-logits, kind="stable")[:k]
    return [int(t) for t in _map(columns, d2t)]


class _TextStream:
    """Writes the decoded text of the tokens so far as it grows, holding back an incomplete UTF-8 character."""

    def __init__(self, tokenizer: Any, out: TextIO) -> None:
        self._tokenizer = tokenizer
        self._out = out
        self._ids: list[int] = []
        self._written = 0

    def push(self, tokens: list[int]) -> None:
        self._ids += tokens
        text: str = self._tokenizer.decode(self._ids)
        if text.endswith("\ufffd"):
            return  # a character whose remaining bytes come with the next token
        self._write(text)

    def end(self) -> None:
        """Write the rest of the text and end the line."""
        self._write(self._tokenizer.decode(self._ids))
        self._out.write("\n")
        self._out.flush()

    def _write(self, text: str) -> None:
        if len(text) > self._written:
            self._out.write(text[self._written:])
            self._out.flush()
            self._written = len(text)


def _is_assistant(bundle: DeploymentConfig) -> bool:
    """Whether ``bundle`` pairs a Gemma 4 MTP assistant (:mod:`trtio.families.gemma4_mtp`): one-token steps at the
    last committed position, seeded and fed back through hidden states."""
    return bundle.draft is not None and bundle.draft.feature(Gemma4MtpConfig) is not None


def _is_dflash(bundle: DeploymentConfig) -> bool:
    """Whether ``bundle`` pairs a block draft: DFlash, JetSpec (:mod:`trtio.families.spec.dflash`)."""
    draft = bundle.draft.feature(SpecConfig) if bundle.draft is not None else None
    return draft is not None and draft.is_block_draft
