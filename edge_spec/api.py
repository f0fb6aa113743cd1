"""The Python API: `edge_spec.load(...)` -> Engine, `engine.generate(prompt, ...)` -> GenerationResult.

The same words as the CLI (`edge-spec generate --model M --prompt P --max-new-tokens N ...`);
`edge_spec.load(bundle=DIR)` / `load_bundle(DIR)` run an exported bundle (`edge-spec export`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np

from edge_spec.contract.backend import DrafterBackend, Session
from edge_spec.contract.layout import kv_layout
from edge_spec.errors import BundleError, CheckpointError, ConfigError
from edge_spec.contract.formats import (EAGER_RUNTIME, RUN, check_options, check_runtime, format_of_runtime,
                                        get_format, runtime_for)
from edge_spec.loading.gguf_common import cache_root
from edge_spec.logs import NOTICES
from edge_spec.decoding.generate import GenerationResult, check_request, generate_plain
from edge_spec.decoding.hostcheck import HostCheck, checked
from edge_spec.contract.kv import KVLayout
from edge_spec.contract.manifest import EAGLE3, MTP, NATIVE_EAGLE3_FORMATS, Manifest, content_id, read_manifest
from edge_spec.contract.manifest_check import check_memory
from edge_spec.decoding.datastore import Datastore
from edge_spec.decoding.datastore_source import load_bundle_datastore, target_datastore
from edge_spec.decoding.sampling import SamplingParams
from edge_spec.decoding.speculative import check_spec_args, generate_speculative
from edge_spec.loading.tokenizer import StreamDecoder, Tokenizer

if TYPE_CHECKING:  # torch's modules: imported where a checkpoint or an eager drafter is used, so that running an
    # exported bundle (load_bundle with its format's runtime) imports no torch (tests/test_api.py)
    from edge_spec.loading.checkpoints import LoadedModel
    from edge_spec.model.drafter import Drafter
    from edge_spec.model.eagle3 import Eagle3Config, Eagle3Drafter

DEFAULT_MAX_CONTEXT = 2048
DEFAULT_SPEC_K = 4
DEFAULT_MIN_CONFIDENCE = 0.3  # adaptive mode: stop a burst when the drafter is less sure than this
BUILTIN_DRAFTERS = Path(__file__).parent / "assets" / "drafters"
# eager torch: one intra-op thread unless asked. SmolLM2 decode is per-op-overhead bound there: 2 threads gave
# 14.8 tok/s on an idle 2-core machine but 1.4 with another process on one core (OpenMP threads wait on each other),
# 1 thread gave 16.3 in the same contended state (measured 2026-12-01, AMD EPYC)
DEFAULT_TORCH_THREADS = 1


def check_threads(threads: int | None) -> int | None:
    """None (the runtime's default), or a thread count >= 1 capped at this machine's cores with a notice: more
    threads than cores only make the decode's threads wait on each other (10,000 would start 10,000)."""
    if threads is None:
        return None
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ConfigError(f"threads must be an integer >= 1, got {threads!r}",
                          "pass --threads 1 up to this machine's core count, or leave it out for the runtime's default")
    cores = os.cpu_count() or 1
    if threads > cores:
        logging.getLogger(NOTICES).warning(f"notice: --threads {threads} is more than this machine's {cores} "
                                               f"cores; using {cores}")
        return cores
    return threads


def check_ids(ids: list, vocab_size: int) -> list[int]:
    """Token ids as given to `generate`: each an integer in [0, vocab_size) (a negative one would wrap through the
    embedding lookup, a larger one fail inside the runtime)."""
    for i, t in enumerate(ids):
        if isinstance(t, (bool, np.bool_)) or not isinstance(t, (int, np.integer)) or not 0 <= t < vocab_size:
            raise ConfigError(f"prompt token {i} is {t!r}, not a token id of this model (0 to {vocab_size - 1})",
                              "pass ids from this model's tokenizer (engine.encode(text)), or the prompt as text")
    return [int(t) for t in ids]


def check_seed(seed: int | None) -> None:
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0):
        raise ConfigError(f"seed must be an integer >= 0, got {seed!r}", "pass --seed 0 or a larger integer")


DRAFTER_FAMILIES = (MTP, EAGLE3)  # what `--drafter builtin:FAMILY` names


def drafter_family(folder: Path) -> str:
    """'eagle3' for a Speculators EAGLE-3 folder, else 'mtp' (edge-spec's own drafter format)."""
    from edge_spec.loading.speculators_eagle3 import speculators_model_type

    return EAGLE3 if speculators_model_type(folder) == EAGLE3 else MTP


def builtin_drafters(model: str) -> dict[str, Path]:
    """family -> folder of the drafters shipped for a built-in model, the default first: BUILTIN_DRAFTERS/MODEL is
    the default (the family that drafts best, docs/drafter.md), BUILTIN_DRAFTERS/MODEL-FAMILY the alternates."""
    from edge_spec.loading.checkpoints import BUILTIN_MODELS

    if model not in BUILTIN_MODELS:
        return {}
    found = {}
    for folder in [BUILTIN_DRAFTERS / model] + [BUILTIN_DRAFTERS / f"{model}-{f}" for f in DRAFTER_FAMILIES]:
        if (folder / "config.json").is_file():
            found.setdefault(drafter_family(folder), folder)
    return found


def resolve_drafter(drafter: str, model: str, *, fmt: str | None = None) -> Path:
    """'builtin' -> the drafter shipped for a built-in model (for format `fmt`: the default family when every runtime
    of that format runs it, the native runner of the phone apps included, else the shipped MTP drafter: an EAGLE-3
    default gives Core ML bundles the MTP one); 'builtin:FAMILY' -> that family's; anything else is a folder path."""
    if drafter != "builtin" and not drafter.startswith("builtin:"):
        return Path(drafter).expanduser()
    shipped = builtin_drafters(model)
    if not shipped:
        raise CheckpointError(f"no built-in drafter is shipped for model {model!r}",
                              "pass --drafter PATH to a drafter folder, or train one with edge-spec train-drafter")
    family = drafter.partition(":")[2]
    if family:
        if family not in shipped:
            names = ", ".join(f"builtin:{f}" for f in shipped)
            raise CheckpointError(f"no built-in {family!r} drafter is shipped for model {model!r} (it ships {names})",
                                  f"name {names.split(', ')[0]} instead, or a drafter folder")
        return shipped[family]
    default = next(iter(shipped))
    if fmt is not None and default == EAGLE3 and fmt not in NATIVE_EAGLE3_FORMATS and MTP in shipped:
        return shipped[MTP]  # a format some runtime of which runs no EAGLE-3 drafter yet (issue 48): the MTP one
    return shipped[default]


def default_drafter(model: str) -> str | None:
    """'builtin' when `model` is a built-in name that ships a drafter, else None (what `export` uses by default)."""
    return "builtin" if builtin_drafters(model) else None


class Engine:
    """A target session (+ optional drafter) with its tokenizer: `generate(prompt, ...)`.

    Built by `load` (a checkpoint, eager PyTorch) or `load_bundle` (an exported bundle, its format's runtime or eager)."""

    def __init__(self, *, session: Session, tokenizer, stop_ids: frozenset[int], vocab_size: int,
                 drafter: DrafterBackend | None = None, runtime: str = EAGER_RUNTIME, max_draft_len: int | None = None,
                 manifest: Manifest | None = None, loaded: LoadedModel | None = None,
                 datastore: Datastore | None = None):
        self.session = session
        self.datastore = datastore  # the static datastore drafter (edge_spec.decoding.datastore), None: none
        # the host check (edge_spec.decoding.hostcheck): None until `check_host` ran; loaders run it when there is a drafter
        self.exactness: HostCheck | None = None
        self.exactness_cached = False
        self.tokenizer = tokenizer
        self.stop_ids = stop_ids
        self.vocab_size = vocab_size
        self.drafter = drafter
        self.runtime = runtime
        self.max_draft_len = max_draft_len
        self.manifest = manifest
        self.loaded = loaded

    @property
    def max_context(self) -> int:
        return self.session.max_context

    def artifact_id(self) -> str:
        """What the host check is keyed on: the bundle's files (every sha256), or the eager model's content id."""
        if self.manifest is not None and self.runtime != EAGER_RUNTIME:
            digest = sorted((rel, f["sha256"]) for rel, f in self.manifest.files.items())
            key = json.dumps([digest, self.session.state.layout.to_json()]).encode()
            return f"bundle:{hashlib.sha256(key).hexdigest()}"
        model = self.session.backend.model
        return f"torch:{content_id(model.cfg.raw, model.state_dict())}:{self.session.state.layout.max_context}"

    def check_host(self, *, fresh: bool = False, cache: bool = True) -> HostCheck:
        """Probe (or read from the cache) whether this host keeps the target batch-invariant and set the session's
        row mode from it (edge_spec.decoding.hostcheck). `fresh`: probe again even if a cached result exists."""
        max_t = (self.max_draft_len or DEFAULT_SPEC_K) + 1
        self.exactness, self.exactness_cached = checked(
            self.session, self.vocab_size, artifact=self.artifact_id(), runtime=self.session.backend.identity,
            cache_dir=cache_root() if cache else None, max_t=min(max_t, 9), fresh=fresh)
        return self.exactness

    def encode(self, prompt: str, *, chat: bool = False) -> list[int]:
        return self.tokenizer.encode_prompt(prompt, chat=chat)

    @property
    def default_spec_k(self) -> int:
        """DEFAULT_SPEC_K, or a bundle's max draft length when that is smaller (an export with --max-draft-len 2)."""
        return min(DEFAULT_SPEC_K, self.max_draft_len or DEFAULT_SPEC_K)

    def generate(self, prompt: str | list[int], *, max_new_tokens: int = 128, temperature: float = 0.0,
                 top_k: int = 0, top_p: float = 1.0, seed: int | None = None, chat: bool = False,
                 stream: Callable[[str], None] | None = None, speculative: bool | None = None,
                 spec_k: int | None = None, adaptive: bool = True,
                 min_confidence: float = DEFAULT_MIN_CONFIDENCE, allow_inexact: bool = False,
                 lookup: bool = True, datastore: bool = True, mtp: bool = True) -> GenerationResult:
        """Generate from a text prompt (or token ids). `stream` receives text deltas as they decode.

        Speculative decoding is on by default when the engine has a drafter (`speculative=False` turns
        it off); the output distribution is the target's either way (greedy: identical tokens). Where the host
        check found this host's kernels not batch-invariant, speculative decoding is replaced by plain decoding
        and `result.extra["notice"]` says so (`allow_inexact=True` runs it anyway: benchmarks that report
        per-prompt exactness). `lookup`: retrieval drafting first (edge_spec.decoding.lookup); then, with `datastore` and
        an engine that has one, the static datastore (edge_spec.decoding.datastore); the MTP drafter otherwise.
        `spec_k` (None: `default_spec_k`): drafts per pass, the most with `adaptive` (the default, as in the CLI and
        the C API: k chosen per pass from measured costs; False drafts exactly `spec_k` every pass). `mtp` False: the
        drafter model never drafts, retrieval alone does (a pass without a retrieval draft is a plain step; for
        measuring what each source gives, `eval-drafter --no-mtp`)."""
        params = SamplingParams(temperature, top_k, top_p)  # validates before any work
        check_seed(seed)
        if seed is not None and not params.greedy:
            # a seed promises the same sample again; adaptive k follows measured timings, and another k makes other
            # random draws (the same distribution, another sample): seeded sampling drafts a fixed k
            adaptive = False
        spec_k = self.default_spec_k if spec_k is None else spec_k
        if isinstance(prompt, (list, tuple, np.ndarray)):
            ids = check_ids(list(prompt), self.vocab_size)
        elif isinstance(prompt, str):
            ids = self.encode(prompt, chat=chat)
        else:
            raise ConfigError(f"prompt must be text or a list of token ids, got {type(prompt).__name__}",
                              "pass a str, or a list of ints from engine.encode(text)")
        check_request(ids, max_new_tokens, self.max_context)
        rng = np.random.default_rng(seed)
        on_token = None
        if stream is not None:
            decoder = StreamDecoder(self.tokenizer)
            stop = self.stop_ids

            def on_token(token: int) -> None:
                if token not in stop:
                    delta = decoder.push(token)
                    if delta:
                        stream(delta)

        if speculative and self.drafter is None:
            raise ConfigError("speculative decoding needs a drafter",
                              "load with drafter='builtin' or a drafter folder, or export a bundle with --drafter")
        notice = None
        if self.drafter is not None and speculative is not False:  # bad speculative arguments fail either way
            check_spec_args(spec_k, min_confidence)
            if self.max_draft_len is not None and spec_k > self.max_draft_len:
                raise ConfigError(f"spec_k {spec_k} exceeds this bundle's max draft length {self.max_draft_len}",
                                  f"use --spec-k {self.max_draft_len} or less, or re-export with --max-draft-len")
            if self.exactness is not None and not self.exactness.exact and not allow_inexact:
                notice, speculative = self.exactness.summary(), False
        if not mtp and not (lookup or (datastore and self.datastore is not None)):
            raise ConfigError("mtp=False leaves no draft source: neither lookup nor a datastore is on",
                              "turn lookup on (or datastore, with a bundle that has one), or keep the drafter (mtp)")
        if self.drafter is not None and speculative is not False:
            result = generate_speculative(self.session, self.drafter if mtp else None, ids, max_new_tokens=max_new_tokens, params=params,
                                          rng=rng, stop_ids=self.stop_ids, k=spec_k, vocab_size=self.vocab_size,
                                          adaptive=adaptive, min_confidence=min_confidence, on_token=on_token,
                                          lookup=lookup, datastore=self.datastore if datastore else None)
        else:
            result = generate_plain(self.session, ids, max_new_tokens=max_new_tokens, params=params, rng=rng,
                                    stop_ids=self.stop_ids, on_token=on_token)
        result.text = self.tokenizer.decode([t for t in result.tokens if t not in self.stop_ids])
        if notice is not None:
            result.extra["notice"] = notice
        return result


def _read_drafter(folder: Path) -> Drafter | Eagle3Config:
    """A drafter folder, told apart by its config.json: a Speculators folder (`speculators_model_type`, read by
    edge_spec.loading.speculators_eagle3, which refuses algorithms other than eagle3) -> its checked config only (its
    tensors load beside the target: they may need the target's embedding); else our MTP drafter, loaded."""
    from edge_spec.loading.checkpoints import load_drafter
    from edge_spec.loading.speculators_eagle3 import read_eagle3_config, speculators_model_type

    if speculators_model_type(folder) is not None:
        return read_eagle3_config(folder)
    return load_drafter(folder)


def _eagle3_drafter(folder: Path, cfg: Eagle3Config, loaded: LoadedModel) -> Eagle3Drafter:
    """The eagle3 drafter of `folder` for the target `loaded`: the pair checked (hidden size, vocabulary, aux
    layers) before any tensor is read; a checkpoint that leaves embed_tokens to the verifier takes the target's."""
    from edge_spec.loading.speculators_eagle3 import load_eagle3
    from edge_spec.model.eagle3 import check_eagle3_pair

    check_eagle3_pair(loaded.config, cfg, f"the target {loaded.name}", f"the EAGLE-3 drafter {folder}")
    return load_eagle3(folder, target_embedding=loaded.model.model.embed_tokens.weight)


def load_export_drafter(folder: str | Path, loaded: LoadedModel) -> Drafter | Eagle3Drafter:
    """The drafter of `folder` for an export beside the target `loaded` (bundle.export_bundle's `drafter`): an MTP
    drafter folder, or a Speculators eagle3 one (the pair checked, the target's embedding where it has none)."""
    from edge_spec.model.eagle3 import Eagle3Config

    folder = Path(folder).expanduser()
    drafter = _read_drafter(folder)
    return _eagle3_drafter(folder, drafter, loaded) if isinstance(drafter, Eagle3Config) else drafter


def datastore_by_default(drafter: Drafter | Eagle3Drafter | None) -> bool:
    """Whether the static datastore drafts by default beside `drafter` (export ships datastore.bin, an eager engine
    loads the target's answers): for MTP drafters, not for EAGLE-3 ones. Measured on SmolLM2's held-out everyday
    prompts, int4 bundles, k = 4 greedy (docs/drafter.md "Which retrieval sources pay"): prompt lookup + the EAGLE-3
    drafter tau 2.29-2.31, with the datastore too 2.11-2.18 (its n-grams take passes the drafter drafts better);
    MTP v4 2.11 vs 2.09, gemma-3-270m's hybrid gains from it (3.01 vs 2.91 without the drafter)."""
    from edge_spec.model.eagle3 import Eagle3Drafter

    return not isinstance(drafter, Eagle3Drafter)


def _torch_runner(loaded: LoadedModel, drafter: Drafter | Eagle3Drafter | None, layout: KVLayout, threads: int):
    """(target backend, drafter backend or None) on eager torch: an MTP drafter reads the target's caches, an
    EAGLE-3 drafter its aux states (runtimes/torch_eagle3: the target wrapped in AuxTarget, the drafter's own cache)."""
    from edge_spec.model.drafter import pair
    from edge_spec.model.eagle3 import Eagle3Drafter
    from edge_spec.runtimes.torch import TorchBackend, TorchDrafter

    if isinstance(drafter, Eagle3Drafter):
        from edge_spec.runtimes.torch_eagle3 import eagle3_pair

        return eagle3_pair(loaded.model, drafter, layout, threads=threads)
    backend = TorchBackend(loaded.model, layout, threads=threads)
    return backend, (TorchDrafter(drafter, backend, pair(loaded.model, drafter)) if drafter is not None else None)


def _torch_engine(loaded: LoadedModel, drafter: Drafter | Eagle3Drafter | None, layout: KVLayout,
                  threads: int | None, prefill_chunk: int = 128, host_check: bool = True, **extra) -> Engine:
    backend, runner = _torch_runner(loaded, drafter, layout, check_threads(threads) or DEFAULT_TORCH_THREADS)
    if "datastore" not in extra and runner is not None and datastore_by_default(drafter):  # a checkpoint: its
        # committed regenerated answers, if any
        extra["datastore"] = target_datastore(loaded.name, loaded.config.vocab_size)
    engine = Engine(session=Session(backend, prefill_chunk=prefill_chunk), tokenizer=loaded.tokenizer,
                    stop_ids=loaded.stop_ids, vocab_size=loaded.config.vocab_size, drafter=runner, runtime=EAGER_RUNTIME,
                    loaded=loaded, **extra)
    if host_check and runner is not None:
        engine.check_host()
    return engine


def load(model: str = "smollm2-135m", *, drafter: str | None = None, runtime: str | None = None,
         max_context: int | None = None, threads: int | None = None, bundle: str | Path | None = None,
         spin: bool = True, host_check: bool = True, **options) -> Engine:
    """Load a built-in model name or a local Hugging Face folder (+ optionally a drafter: 'builtin' or a
    folder) and return a ready Engine. With `bundle=DIR`, load an exported bundle instead (see `load_bundle`;
    runtime defaults to the bundle format's there, "torch" otherwise). `host_check`: with a drafter, probe (once per
    model, runtime and CPU; cached) that speculative decoding is exact on this host (`Engine.check_host`).
    `options`: the bundle runtime's own (see `load_bundle`); the eager runtime has none."""
    if bundle is not None:
        if drafter is not None:
            raise ConfigError("a bundle brings its own drafter; `drafter` cannot be combined with `bundle`",
                              "re-export the bundle with --drafter, or load the checkpoint instead of the bundle")
        return load_bundle(bundle, runtime=runtime, threads=threads, max_context=max_context, spin=spin,
                           host_check=host_check, **options)
    runtime = runtime or EAGER_RUNTIME
    check_runtime(runtime)
    if runtime != EAGER_RUNTIME:
        raise ConfigError(f"the {runtime} runtime runs exported bundles, not checkpoints",
                          f"export one first (edge-spec export --model {model} --out DIR) and pass bundle=DIR "
                          "(CLI: --bundle DIR)")
    check_options(None, options, RUN, runtime=runtime)
    from edge_spec.loading.checkpoints import load as load_checkpoint
    from edge_spec.model.eagle3 import Eagle3Config

    drafter_folder = resolve_drafter(drafter, model) if drafter else None
    # a bad drafter fails before the target loads
    drafter_module = _read_drafter(drafter_folder) if drafter_folder is not None else None
    loaded = load_checkpoint(model)
    if isinstance(drafter_module, Eagle3Config):
        drafter_module = _eagle3_drafter(drafter_folder, drafter_module, loaded)
    max_context = max_context or min(DEFAULT_MAX_CONTEXT, loaded.config.max_position_embeddings)
    if isinstance(max_context, bool) or not isinstance(max_context, int) or max_context < 2:
        raise ConfigError(f"max_context must be an integer >= 2, got {max_context!r}", "pass --max-context 2048, say")
    layout = kv_layout(loaded.config, max_context)
    check_memory(layout, Path(model))
    return _torch_engine(loaded, drafter_module, layout, threads, host_check=host_check)


def _bundle_layout(manifest: Manifest, max_context: int | None) -> KVLayout:
    """The manifest's layout, or the same layout for a smaller context."""
    if max_context is None or max_context == manifest.max_context:
        return manifest.layout
    if isinstance(max_context, bool) or not isinstance(max_context, int) or not 1 <= max_context <= manifest.max_context:
        raise ConfigError(f"max_context {max_context!r} does not fit this bundle (exported for at most "
                          f"{manifest.max_context})", f"use --max-context {manifest.max_context} or less, or re-export "
                          "with a larger --max-context")
    return manifest.layout.with_context(max_context)


def load_bundle(folder: str | Path, *, runtime: str | None = None, threads: int | None = None,
                max_context: int | None = None, verify_checksums: bool = True, spin: bool = True,
                host_check: bool = True, **options) -> Engine:
    """Load an exported bundle (verified: schema, sha256 of every file, drafter/target pairing).

    runtime None: the one the bundle's format runs on (its row in edge_spec.contract.formats); "torch": the eager
    reference, reloading the checkpoints the bundle was exported from (their content hashes must match the manifest).
    Speculative decoding is on by default when the bundle has a drafter.
    `spin`: the target's idle threads busy-wait between steps (where the runtime's thread pool does: fastest on an
    otherwise idle machine); False lets them sleep (use it when other processes share the cores). The drafter never
    spins: it runs between target steps and its spinning would steal their cores.
    `host_check`: with a drafter, probe (once per bundle, runtime and CPU; cached) that verify rows equal decode
    steps bit for bit on this host and pick the session's row mode from it (`Engine.check_host`).
    `options`: the runtime's own, as its format's row declares them (formats.RUN options, e.g. `provider=`);
    None means the runtime's default, and one the runtime does not declare is refused.
    """
    folder = Path(folder).expanduser()
    manifest = read_manifest(folder, verify_checksums=verify_checksums)
    fmt = get_format(manifest.format)
    runtime = runtime or fmt.runtime
    check_runtime(runtime)
    options = check_options(format_of_runtime(runtime), options, RUN, runtime=runtime)
    layout = _bundle_layout(manifest, max_context)
    extra = {"max_draft_len": manifest.max_draft_len, "manifest": manifest,
             "datastore": load_bundle_datastore(folder, manifest.datastore, manifest.vocab_size)}
    if runtime == EAGER_RUNTIME:
        loaded, drafter = _bundle_sources(manifest, fmt.runtime)
        return _torch_engine(loaded, drafter, layout, threads, host_check=host_check, **extra)
    if runtime != fmt.runtime:
        raise BundleError(f"{folder}: the {runtime} runtime does not run {manifest.format!r} bundles",
                          f"use --runtime {fmt.runtime} (or torch), or export with the format {runtime} runs")
    own = manifest.drafter.draft_layout if manifest.drafter is not None and manifest.drafter.draft_kv else None
    check_memory(layout, folder, drafter=own)  # an EAGLE-3 drafter's own cache counts too
    backend, runner = runtime_for(manifest.format).open_bundle(folder, manifest, layout, threads=check_threads(threads), spin=spin,
                                                               **options)
    engine = Engine(session=Session(backend), tokenizer=Tokenizer(folder), stop_ids=frozenset(manifest.eos_token_ids),
                    vocab_size=manifest.vocab_size, drafter=runner, runtime=runtime, **extra)
    if host_check and runner is not None:
        engine.check_host()
    return engine


def _bundle_sources(manifest: Manifest, own_runtime: str) -> tuple[LoadedModel, Drafter | Eagle3Drafter | None]:
    """The eager models a bundle was exported from, checked against the manifest's content hashes."""
    from edge_spec.contract.bundle import eagle3_config
    from edge_spec.loading.checkpoints import load as load_checkpoint
    from edge_spec.loading.checkpoints import load_drafter
    from edge_spec.loading.speculators_eagle3 import read_eagle3_config

    entries = [("target", manifest.target)] + ([("drafter", manifest.drafter)] if manifest.drafter else [])
    loaded, drafter = None, None
    for role, entry in entries:
        if not entry.source or not Path(entry.source).is_dir():
            raise BundleError(f"the bundle's {role} checkpoint {entry.source or '(exported from memory)'} is not "
                              "available, so the torch runtime cannot rebuild it", f"use runtime {own_runtime!r} for this bundle")
        if role == "target":
            loaded = load_checkpoint(entry.source)
            state, raw = loaded.model.state_dict(), loaded.config.raw
        elif entry.kind == EAGLE3:
            drafter = _eagle3_drafter(Path(entry.source), read_eagle3_config(entry.source), loaded)
            state, raw = drafter.state_dict(), eagle3_config(drafter.cfg)
        else:
            drafter = load_drafter(entry.source)
            state, raw = drafter.state_dict(), drafter.cfg.raw
        if content_id(raw, state) != entry.content_sha256:
            raise BundleError(f"the {role} checkpoint at {entry.source} has changed since this bundle was exported",
                              f"re-export the bundle, or use runtime {own_runtime!r}")
    return loaded, drafter
