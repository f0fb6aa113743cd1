"""ONNX Runtime backend (target) and drafter over a bundle's `io` graphs (edge_spec/contract/kv.py, manifest.py).

Caches: edge_spec.runtimes.io_caches (bucketed views of one flat buffer per cached layer, committed rows written in
place). Every input and output is bound once through IOBinding to preallocated buffers and only rebound when T
or a bucket changes, so a steady-state decode step binds nothing.

The drafter binds the *same* cache buffers (its source layers' current bucket views) and the shared,
memory-mapped `embed_table` of the bundle: it owns no cache and no copy of the table.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np

from edge_spec.contract import kv
from edge_spec.contract.backend import DraftStep, StepOutput
from edge_spec.errors import BundleError, ConfigError
from edge_spec.contract.manifest import EAGLE3, EAGLE3_FC_GRAPH
from edge_spec.runtimes.io_caches import BUCKET, IoCaches, NewRows
from edge_spec.runtimes.ort_eagle3 import OrtEagle3Drafter, draft_layout
from edge_spec.contract.kv import CacheSpec, KVLayout

PROVIDERS = {"cpu": "CPUExecutionProvider", "xnnpack": "XnnpackExecutionProvider",
             "coreml": "CoreMLExecutionProvider"}
_PROVIDER_FIX = {
    "xnnpack": "use an onnxruntime build with XNNPACK (the Android/iOS packages, or build with --use_xnnpack), "
               "or --provider cpu",
    "coreml": "on macOS install the standard `onnxruntime` wheel (it ships CoreML), or --provider cpu",
}


def _import_ort():
    try:
        import onnxruntime
    except ImportError as err:  # pragma: no cover - a declared dependency
        raise ConfigError("onnxruntime is not installed", "pip install onnxruntime") from err
    return onnxruntime


M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number
MMAP_THRESHOLD = 128 * 1024  # glibc's default threshold, kept fixed
_returning = []


def return_freed_buffers() -> bool:
    """Have the process give a large freed buffer back to the system (glibc; elsewhere nothing changes: False).

    Without its arena onnxruntime mallocs each pass's buffers and frees them after the pass. glibc serves a buffer over
    its mmap threshold (128 KB) from a mapping of its own, returned when freed, but after the first such free it raises
    the threshold to that buffer's size (up to 32 MB) and serves later ones from the heap, which keeps them: the heap
    grows to the largest pass's working set and stays there. A fixed threshold (mallopt, which also stops the raising)
    keeps every large buffer a mapping of its own. `make demo`'s decode peaked 296-299 -> 289-290 MB with it
    (docs/benchmarks.md "2026-12-07 (afternoon)"). Process-wide, set once, by the first session made."""
    if not _returning:
        import ctypes
        import platform

        done = False
        if sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc":
            done = bool(ctypes.CDLL(None).mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD))
        _returning.append(done)
    return _returning[0]


def make_session(path: Path, *, provider: str | None = "cpu", threads: int | None = None,
                 initializers: dict | None = None, spin: bool = False):
    """An InferenceSession on `provider` (cpu, also for None | xnnpack | coreml) with `threads` intra-op threads.

    `initializers`: name -> numpy array supplied by the caller instead of the file's copy (shared tables).
    `spin`: let idle intra-op threads busy-wait (onnxruntime's default). On an idle 2-core machine spinning makes
    SmolLM2 int8 plain decode ~40% faster; with another process on the cores it costs ~45% (both measured,
    docs/architecture.md), so callers choose (edge_spec.api.load_bundle: target on, drafter off)."""
    ort = _import_ort()
    provider = provider or "cpu"
    if provider == "qnn":  # the old providers=["QNNExecutionProvider"] form silently ran everything on the CPU
        raise ConfigError("onnx bundles do not run on Qualcomm's HTP (symbolic shapes, MatMulNBits)",
                          "export a qnn bundle: edge-spec export --format qnn --soc sm8650 (static QDQ graphs)")
    if provider not in PROVIDERS:
        raise ConfigError(f"unknown execution provider {provider!r}", f"choose one of {', '.join(PROVIDERS)}")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ConfigError(f"threads must be an integer >= 1, got {threads!r}")
    name = PROVIDERS[provider]
    available = ort.get_available_providers()
    if name not in available:
        raise ConfigError(f"execution provider {provider!r} ({name}) is not available in this onnxruntime build "
                          f"(available: {', '.join(available)})", _PROVIDER_FIX.get(provider))
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads or 0  # 0 = onnxruntime's default (one per physical core)
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = 3
    # no CPU memory arena: it keeps the largest pass's buffers (a prefill chunk, the host check's probes) for the
    # session's life. `make demo`'s decode peaked 15 MB lower without it (316-317 -> 301-302 MB), at the same speed
    # (95.6-98.4 vs 96.7-97.2 tok/s, three interleaved runs each, Intel Xeon, 2026-12-07: docs/benchmarks.md)
    so.enable_cpu_mem_arena = False
    return_freed_buffers()  # and the freed buffers go back to the system, not to the heap
    so.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    keep = []
    if initializers:
        values = [ort.OrtValue.ortvalue_from_numpy(np.asarray(a)) for a in initializers.values()]
        so.add_external_initializers(list(initializers), values)
        keep = [initializers, values]  # must outlive the session
    providers = [name] if name == "CPUExecutionProvider" else [name, "CPUExecutionProvider"]
    options = {"xnnpack": [{"intra_op_num_threads": threads or os.cpu_count() or 1}]}.get(provider, [{}])
    if name != "CPUExecutionProvider":
        options.append({})
    try:
        session = ort.InferenceSession(str(path), so, providers=providers, provider_options=options)
    except Exception as err:  # onnxruntime raises its own Fail/InvalidGraph types with long messages
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise BundleError(f"{path}: onnxruntime {ort.__version__} cannot load this graph ({first[:300]})",
                          "re-export the bundle with this edge-spec / onnxruntime, or update onnxruntime") from err
    session._edge_spec_keepalive = keep
    session._edge_spec_identity = (f"onnxruntime {ort.__version__}, {name}, "
                                   f"{threads or 'default'} intra-op threads")  # edge_spec.decoding.hostcheck's cache key
    return session


_ORT_TYPES = {"float32": "tensor(float)", "int64": "tensor(int64)", "uint8": "tensor(uint8)"}


def check_graph_io(session, io: kv.GraphIO, path: Path) -> None:
    """The loaded graph's own inputs and outputs (names, order, element types, ranks, fixed dims) must be the ones
    the manifest records (which `read_manifest` checked against the KV contract): a graph file swapped or edited
    after export fails here, naming the file, instead of binding buffers of the wrong shape."""
    for role, got, want in (("input", session.get_inputs(), io.inputs), ("output", session.get_outputs(), io.outputs)):
        names = [g.name for g in got]
        if names != [w.name for w in want]:
            raise BundleError(f"{path}: graph {role}s {names} differ from the manifest's {[w.name for w in want]}",
                              "re-export the bundle (the graph file does not belong to this manifest)")
        for g, w in zip(got, want):
            fixed_ok = all(not isinstance(d, int) or d == gd for d, gd in zip(w.shape, g.shape))
            if g.type != _ORT_TYPES[w.dtype] or len(g.shape) != len(w.shape) or not fixed_ok:
                raise BundleError(f"{path}: graph {role} {g.name} is {g.type} {list(g.shape)}, the manifest says "
                                  f"{w.dtype} {list(w.shape)}", "re-export the bundle")


def open_bundle(folder: Path, manifest, layout: KVLayout, *, threads: int | None = None, provider: str | None = None,
                spin: bool = True) -> tuple["OrtBackend", "OrtDrafter | None"]:
    """The runtime half of the onnx format (edge_spec.contract.formats): target session (spinning unless `spin` is False) +
    drafter session (never spinning), both binding the bundle's memory-mapped shared tables."""
    from edge_spec.contract.manifest import read_table

    tables = {name: read_table(folder, entry) for name, entry in manifest.tables.items()}
    target_entry = manifest.graphs["target"]
    target = make_session(folder / target_entry.file, provider=provider, threads=threads,
                          initializers={n: tables[n] for n in kv.TARGET_TABLES if n in tables}, spin=spin)
    check_graph_io(target, target_entry.io, folder / target_entry.file)
    backend = OrtBackend(target, layout, manifest.vocab_size, manifest.hidden_size)
    if manifest.drafter is None:
        return backend, None
    sessions = {}
    for name in ("drafter", EAGLE3_FC_GRAPH) if manifest.drafter.kind == EAGLE3 else ("drafter",):
        entry = manifest.graphs[name]
        sessions[name] = make_session(folder / entry.file, provider=provider, threads=threads, spin=False)
        check_graph_io(sessions[name], entry.io, folder / entry.file)
    entry, session = manifest.graphs["drafter"], sessions["drafter"]
    wanted = {t.name for t in entry.io.inputs}
    if manifest.drafter.kind == EAGLE3:  # its own cache, its fc graph (runtimes/ort_eagle3.py)
        draft = draft_layout(manifest.drafter.draft_layout, layout.max_context)
        return backend, OrtEagle3Drafter(sessions["drafter"], sessions[EAGLE3_FC_GRAPH], backend, draft,
                                         {name: t for name, t in tables.items() if name in wanted})
    runner = OrtDrafter(session, backend, {k: int(v) for k, v in manifest.drafter.kv_sharing.items()},
                        {name: t for name, t in tables.items() if name in wanted}, manifest.drafter.candidates_per_step)
    return backend, runner


def diagnose(folder: Path, manifest, *, threads: int | None = None, nodes: bool = False) -> str:
    """`edge-spec check`'s onnx options: `nodes`, the node-by-node comparison of a one-token step and row 0 of a
    verify pass (edge_spec.runtimes.ort_diff)."""
    from edge_spec.runtimes.ort_diff import node_diff

    return node_diff(folder, threads=threads).text() if nodes else ""


class _Buffers:
    """Per-T input/output buffers, reallocated only when a forward needs a larger T."""

    def __init__(self, t_cap: int, layout: KVLayout, vocab: int, hidden: int, aux: int = 0):
        self.t_cap = t_cap
        self.aux = np.zeros(t_cap * aux, dtype=np.float32) if aux else None  # kv.AUX_HIDDEN rows [T, aux]
        self.ids = np.zeros(t_cap, dtype=np.int64)
        self.pos = np.zeros(t_cap, dtype=np.int64)
        spare = kv.SHARED_SPARE_SLOTS if layout.binding == kv.BINDING_SHARED else 0
        self.masks = {kind: np.zeros(t_cap * (layout.slots(kind) + spare + t_cap), dtype=np.float32)
                      for kind in layout.kinds()}
        self.logits = np.zeros(t_cap * vocab, dtype=np.float32)
        self.hidden = np.zeros(t_cap * hidden, dtype=np.float32)
        self.rows = np.arange(t_cap, dtype=np.int64)  # LOGIT_ROWS of a pass that wants every row
        self.last_row = np.zeros(1, dtype=np.int64)  # LOGIT_ROWS of a prefill chunk: [T - 1]
        # the new K/V rows of a pass (`io` binding; a `shared` graph writes them into the bound caches)
        self.new = NewRows(layout, t_cap) if layout.binding == kv.BINDING_IO else None


def _bind(binding, name: str, array: np.ndarray, output: bool = False) -> None:
    """Bind a contiguous numpy array by pointer (zero copy; ORT reads/writes it at run time)."""
    assert array.flags.c_contiguous
    dtype = np.float32 if array.dtype == np.float32 else np.int64
    args = (name, "cpu", 0, dtype, list(array.shape), array.ctypes.data)
    (binding.bind_output if output else binding.bind_input)(*args)


class OrtBackend:
    """edge_spec.contract.backend.Backend over an ONNX Runtime session of the bundle's target graph."""

    name = "ort"

    def __init__(self, session, layout: KVLayout, vocab_size: int, hidden_size: int):
        self.session = session
        self.layout = layout
        self.vocab, self.hidden_size = vocab_size, hidden_size
        self.specs: list[CacheSpec] = list(layout.caches)
        self.caches = IoCaches(layout, BUCKET, kv.SHARED_SPARE_SLOTS if layout.binding == kv.BINDING_SHARED else 0)
        # an eagle3 bundle's target also returns kv.AUX_HIDDEN [1, T, aux_width]; after each pass `aux_sink` (set by
        # the eagle3 drafter, runtimes/ort_eagle3.py) gets (ids [T], positions [T], aux rows [T, aux_width])
        self.aux_width = next((int(o.shape[-1]) for o in session.get_outputs() if o.name == kv.AUX_HIDDEN), 0)
        self.aux_sink = None
        self.buffers = _Buffers(1, layout, vocab_size, hidden_size, self.aux_width)
        # graphs exported since 2026-12-05 take kv.LOGIT_ROWS: a prefill chunk runs the head on its last row only
        self.logit_rows = kv.LOGIT_ROWS in {i.name for i in session.get_inputs()}
        # one IOBinding per pass length T (and last-row-only or not), all pointing into the current buffers and cache
        # views (`_views`): a binding is ~4 pointers per cached layer, and rebinding on every change of T (plain step
        # <-> verify pass) cost ~1.5 ms a time in SmolLM2 (4% of an adaptive run that alternates T = 1 and 2)
        self._bindings: dict[tuple[int, bool], object] = {}
        self._views = None  # (T capacity, buckets, cache generation) the bindings point into
        self._pending = 0  # T of the last forward (its new rows sit in buffers.new)
        self.kernel_s = 0.0  # seconds spent inside onnxruntime (the rest of a step is Python)

    @property
    def identity(self) -> str:
        """What kernels run (library, version, provider, threads): part of the host check's cache key."""
        return getattr(self.session, "_edge_spec_identity", "onnxruntime")

    @property
    def bucket_size(self) -> int:
        """Cache slots are bound in multiples of this: the host check probes verify passes across its edges."""
        return BUCKET

    @property
    def bucket(self) -> dict[str, int]:  # kind -> slots bound
        return self.caches.bucket

    @property
    def generation(self) -> int:  # bumped whenever a cache view moves (the drafter rebinds then)
        return self.caches.generation

    def cache_views(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        return self.caches.views(i)

    # -- Backend protocol ----------------------------------------------------------------------------
    def forward(self, input_ids: np.ndarray, position_ids: np.ndarray, masks: dict[str, np.ndarray],
                n_cached: int, last_only: bool) -> StepOutput:
        t = input_ids.shape[1]
        self.caches.prepare(n_cached, t)  # a split-form graph just gets a few more slots than it needs
        if t > self.buffers.t_cap:
            self.buffers = _Buffers(max(t, 2 * self.buffers.t_cap), self.layout, self.vocab, self.hidden_size,
                                    self.aux_width)
        buf = self.buffers
        buf.ids[:t] = input_ids[0]
        buf.pos[:t] = position_ids[0]
        mask_views = {}
        for kind, mask in masks.items():  # [1, 1, T, S + T] -> the bound [1, 1, T, b + T]
            s, b = self.layout.slots(kind), self.bucket[kind]
            view = buf.masks[kind][:t * (b + t)].reshape(1, 1, t, b + t)
            seen = min(b, s)  # a `shared` bucket may bind a spare slot past the layer's own (never visible)
            view[..., :seen] = mask[..., :seen]
            view[..., seen:b] = kv.NEG_INF
            view[..., b:] = mask[..., s:]
            mask_views[kind] = view
        views = (buf.t_cap, tuple(sorted(self.bucket.items())), self.caches.generation)
        if views != self._views:  # buffers or cache views moved: every binding points at old memory
            self._bindings.clear()
            self._views = views
        last = last_only and t > 1 and self.logit_rows  # the graph runs the head on the last row only
        buf.last_row[0] = t - 1
        binding = self._bindings.get((t, last))
        if binding is None:
            binding = self._bindings[(t, last)] = self.session.io_binding()
            self._bind_pass(binding, t, mask_views, last)
        start = time.perf_counter()
        self.session.run_with_iobinding(binding)
        self.kernel_s += time.perf_counter() - start
        self._pending = t
        if self.aux_sink is not None:
            self.aux_sink(buf.ids[:t], buf.pos[:t], buf.aux[:t * self.aux_width].reshape(t, self.aux_width))
        r = 1 if last else t  # rows the graph returned
        rows = slice(r - 1, r) if last_only else slice(0, r)
        logits = buf.logits[:r * self.vocab].reshape(r, self.vocab)[rows].copy()
        hidden = buf.hidden[:r * self.hidden_size].reshape(r, self.hidden_size)[rows].copy()
        return StepOutput(logits, hidden)

    def _bind_pass(self, bind, t: int, mask_views: dict[str, np.ndarray], last: bool) -> None:
        buf = self.buffers
        r = 1 if last else t
        _bind(bind, kv.INPUT_IDS, buf.ids[:t].reshape(1, t))
        _bind(bind, kv.POSITION_IDS, buf.pos[:t].reshape(1, t))
        if self.logit_rows:
            _bind(bind, kv.LOGIT_ROWS, buf.last_row if last else buf.rows[:t])
        for kind, view in mask_views.items():
            _bind(bind, kv.mask_name(kind), view)
        for i, spec in enumerate(self.specs):
            k, v = self.cache_views(i)
            _bind(bind, kv.k_cache_name(spec.layer), k)
            _bind(bind, kv.v_cache_name(spec.layer), v)
        _bind(bind, kv.LOGITS, buf.logits[:r * self.vocab].reshape(1, r, self.vocab), output=True)
        _bind(bind, kv.HIDDEN, buf.hidden[:r * self.hidden_size].reshape(1, r, self.hidden_size), output=True)
        if buf.aux is not None:
            _bind(bind, kv.AUX_HIDDEN, buf.aux[:t * self.aux_width].reshape(1, t, self.aux_width), output=True)
        for i, spec in enumerate(self.specs):
            if buf.new is None:  # `shared`: the caches out are the caches in (the graph writes its rows in place)
                k, v = self.cache_views(i)
                _bind(bind, kv.k_present_name(spec.layer), k, output=True)
                _bind(bind, kv.v_present_name(spec.layer), v, output=True)
            else:
                k, v = buf.new.views(i, t)
                _bind(bind, kv.k_new_name(spec.layer), k, output=True)
                _bind(bind, kv.v_new_name(spec.layer), v, output=True)

    def commit(self, plan: dict[str, tuple[np.ndarray, np.ndarray]]) -> None:
        assert self._pending, "commit without a forward"
        self.caches.commit(plan, self.buffers.new, self._pending)
        self._pending = 0

    def reset(self) -> None:
        self._pending = 0


class OrtDrafter:
    """edge_spec.contract.backend.DrafterBackend over the bundle's drafter graph, reading the OrtBackend's caches."""

    def __init__(self, session, target: OrtBackend, sources: dict[str, int], tables: dict[str, np.ndarray],
                 candidates: int):
        self.session = session
        self.target = target
        self.sources = kv.source_caches(target.layout, sources)
        self.tables = tables
        self.candidates = candidates
        h = target.hidden_size
        self.ids = np.zeros((1, 1), dtype=np.int64)
        self.pos = np.zeros((1, 1), dtype=np.int64)
        self.hidden = np.zeros((1, 1, h), dtype=np.float32)
        self.masks = {kind: np.full(target.layout.slots(kind) + target.caches.spare, kv.NEG_INF, dtype=np.float32)
                      for kind in self.sources}
        self.out_ids = np.zeros(candidates, dtype=np.int64)
        self.out_logits = np.zeros(candidates, dtype=np.float32)
        self.out_hidden = np.zeros((1, 1, h), dtype=np.float32)
        self.binding = session.io_binding()
        self._bound = None
        self.kernel_s = 0.0  # seconds spent inside onnxruntime

    def begin(self, position: int, masks: dict[str, np.ndarray], n_cached: int) -> None:
        self.pos[0, 0] = position
        views = {}
        for kind, i in self.sources.items():
            b = self.target.bucket[kind]
            view = self.masks[kind][:b].reshape(1, 1, 1, b)
            seen = min(b, masks[kind].shape[-1])  # a spare slot past the layer's own stays masked
            view[..., :seen] = masks[kind][..., :seen]
            views[kind] = view
        signature = (self.target.generation, tuple(sorted(self.target.bucket.items())))
        if signature != self._bound:
            self._rebind(views)
            self._bound = signature

    def _rebind(self, mask_views: dict[str, np.ndarray]) -> None:
        bind = self.binding
        bind.clear_binding_inputs()
        bind.clear_binding_outputs()
        _bind(bind, kv.INPUT_IDS, self.ids)
        _bind(bind, kv.HIDDEN, self.hidden)
        _bind(bind, kv.POSITION_IDS, self.pos)
        for kind, i in self.sources.items():
            layer = self.target.specs[i].layer
            _bind(bind, kv.mask_name(kind), mask_views[kind])
            k, v = self.target.cache_views(i)
            _bind(bind, kv.k_cache_name(layer), k)
            _bind(bind, kv.v_cache_name(layer), v)
        for name, table in self.tables.items():
            _bind_table(bind, name, table)
        _bind(bind, kv.DRAFT_TOKEN_IDS, self.out_ids, output=True)
        _bind(bind, kv.DRAFT_LOGITS, self.out_logits, output=True)
        _bind(bind, kv.DRAFT_HIDDEN, self.out_hidden, output=True)

    def step(self, token: int, hidden: np.ndarray) -> DraftStep:
        self.ids[0, 0] = token
        self.hidden[0, 0] = hidden
        start = time.perf_counter()
        self.session.run_with_iobinding(self.binding)
        self.kernel_s += time.perf_counter() - start
        return DraftStep(self.out_ids.copy(), self.out_logits.copy(), self.out_hidden[0, 0].copy())


def _bind_table(binding, name: str, table: np.ndarray) -> None:
    """Tables are read-only memory maps: bind by pointer (ORT never writes graph inputs)."""
    binding.bind_input(name, "cpu", 0, table.dtype.type, list(table.shape), table.ctypes.data)
