"""ONNX Runtime backend (target) and drafter over a bundle's `io` graphs (edge_spec/kv.py, manifest.py).

Cache buffers: one flat float32 buffer per cached layer and K / V, allocated once with the layer's full
slot count. The graphs take a symbolic cache length per attention kind, so the backend binds only a
*bucket*: the smallest multiple of BUCKET slots that holds every visible key (full attention: and the slots
the new rows are written to, see edge_spec.model.attend_slots), viewed as the contiguous
prefix [1, H_kv, b, D] of the flat buffer (the contract's head-major layout, nothing copied per step).
When a kind's bucket grows (every BUCKET tokens) the heads are moved apart in place, O(rows in use);
after a reset / rewind it shrinks the same way. Committed rows are written into the bound views in
place. Every input and output is bound once through IOBinding to these preallocated buffers and only
rebound when T or a bucket changes, so a steady-state decode step binds nothing.

The drafter binds the *same* cache buffers (its source layers' current bucket views) and the shared,
memory-mapped `embed_table` of the bundle: it owns no cache and no copy of the table.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable

import numpy as np

from edge_spec import kv
from edge_spec.backend import DraftStep, StepOutput
from edge_spec.errors import BundleError, ConfigError
from edge_spec.kv import CacheSpec, KVLayout

BUCKET = 64  # cache slots bound per step are a multiple of this (or the layer's full slot count)
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
                                   f"{threads or 'default'} intra-op threads")  # edge_spec.hostcheck's cache key
    return session


_ORT_TYPES = {"float32": "tensor(float)", "int64": "tensor(int64)"}


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
    """The runtime half of the onnx format (edge_spec.formats): target session (spinning unless `spin` is False) +
    drafter session (never spinning), both binding the bundle's memory-mapped shared tables."""
    from edge_spec.manifest import read_table

    tables = {name: read_table(folder, entry) for name, entry in manifest.tables.items()}
    target_entry = manifest.graphs["target"]
    target = make_session(folder / target_entry.file, provider=provider, threads=threads,
                          initializers={kv.EMBED_TABLE: tables[kv.EMBED_TABLE]}, spin=spin)
    check_graph_io(target, target_entry.io, folder / target_entry.file)
    backend = OrtBackend(target, layout, manifest.vocab_size, manifest.hidden_size)
    if manifest.drafter is None:
        return backend, None
    entry = manifest.graphs["drafter"]
    session = make_session(folder / entry.file, provider=provider, threads=threads, spin=False)
    check_graph_io(session, entry.io, folder / entry.file)
    wanted = {t.name for t in entry.io.inputs}
    runner = OrtDrafter(session, backend, {k: int(v) for k, v in manifest.drafter.kv_sharing.items()},
                        {name: t for name, t in tables.items() if name in wanted}, manifest.drafter.candidates_per_step)
    return backend, runner


def _bucket(used: int, slots: int) -> int:
    return kv.bucket_slots(used, slots, BUCKET)


def _shape_groups(specs: list[CacheSpec]) -> dict[tuple, list[int]]:
    """Cached layers with one cache shape (kind, KV heads, head dim, slots) -> their indices in `specs`."""
    groups: dict[tuple, list[int]] = {}
    for i, s in enumerate(specs):
        groups.setdefault((s.kind, s.num_kv_heads, s.head_dim, s.slots), []).append(i)
    return groups


def _grouped_rows(groups: dict[tuple, list[int]], rows: Callable[[tuple], int]
                  ) -> tuple[dict[tuple, np.ndarray], list[tuple[np.ndarray, np.ndarray]]]:
    """One zeroed store [2n, H_kv * rows(group) * D] per shape group (`_shape_groups`); returns (stores, per cached
    layer its (K, V) rows of its group's store: rows 2j and 2j + 1 for the group's j-th layer)."""
    stores = {key: np.zeros((2 * len(idx), key[1] * rows(key) * key[2]), dtype=np.float32) for key, idx in groups.items()}
    per_layer: list = [None] * sum(len(idx) for idx in groups.values())
    for key, idx in groups.items():
        for j, i in enumerate(idx):
            per_layer[i] = (stores[key][2 * j], stores[key][2 * j + 1])
    return stores, per_layer


def _stacked(store: np.ndarray, heads: int, rows: int, dim: int) -> np.ndarray:
    """[2n, >= heads*rows*dim] store -> its row prefixes as [2n, heads, rows, dim], a view (never a copy: setting
    .shape raises instead of copying)."""
    view = store[:, :heads * rows * dim].view()
    view.shape = (store.shape[0], heads, rows, dim)
    return view


class _LayerCache:
    """K or V of one cached layer: a flat buffer of the layer's full size (a row of its shape group's store),
    viewed as its current bucket."""

    def __init__(self, spec: CacheSpec, flat: np.ndarray):
        self.heads, self.dim = spec.num_kv_heads, spec.head_dim
        self.flat = flat

    def view(self, b: int) -> np.ndarray:  # [1, H_kv, b, D], contiguous
        return self.flat[:self.heads * b * self.dim].reshape(1, self.heads, b, self.dim)

    def relayout(self, old: int, new: int, rows: int) -> None:
        """Re-view the buffer from bucket `old` to `new`, keeping rows [0, rows) of every head (in place)."""
        if old == new or self.heads == 1 or rows == 0:
            return
        src, dst = self.view(old)[0], self.view(new)[0]
        order = range(self.heads - 1, 0, -1) if new > old else range(1, self.heads)  # never overwrite unread rows
        for h in order:
            dst[h, :rows] = src[h, :rows]  # numpy buffers overlapping copies


class _Buffers:
    """Per-T input/output buffers, reallocated only when a forward needs a larger T."""

    def __init__(self, t_cap: int, layout: KVLayout, vocab: int, hidden: int):
        self.t_cap = t_cap
        self.ids = np.zeros(t_cap, dtype=np.int64)
        self.pos = np.zeros(t_cap, dtype=np.int64)
        self.masks = {kind: np.zeros(t_cap * (layout.slots(kind) + t_cap), dtype=np.float32) for kind in layout.kinds()}
        self.logits = np.zeros(t_cap * vocab, dtype=np.float32)
        self.hidden = np.zeros(t_cap * hidden, dtype=np.float32)
        # new K/V rows, stacked like the caches: group -> [2n, H_kv * t_cap * D]; new[i] = layer i's (K, V) rows
        self.new_store, self.new = _grouped_rows(_shape_groups(list(layout.caches)), lambda key: t_cap)


def _bind(binding, name: str, array: np.ndarray, output: bool = False) -> None:
    """Bind a contiguous numpy array by pointer (zero copy; ORT reads/writes it at run time)."""
    assert array.flags.c_contiguous
    dtype = np.float32 if array.dtype == np.float32 else np.int64
    args = (name, "cpu", 0, dtype, list(array.shape), array.ctypes.data)
    (binding.bind_output if output else binding.bind_input)(*args)


class OrtBackend:
    """edge_spec.backend.Backend over an ONNX Runtime session of the bundle's target graph."""

    name = "ort"

    def __init__(self, session, layout: KVLayout, vocab_size: int, hidden_size: int):
        self.session = session
        self.layout = layout
        self.vocab, self.hidden_size = vocab_size, hidden_size
        self.specs: list[CacheSpec] = list(layout.caches)
        # layers with one cache shape keep K and V as rows of one store [2n, H_kv * slots * D], so a commit
        # copies the accepted rows of all of them in one assignment
        self.groups = _shape_groups(self.specs)
        self.stores, rows = _grouped_rows(self.groups, lambda key: key[3])  # key[3]: the group's slot count
        self.k = [_LayerCache(spec, k) for spec, (k, _) in zip(self.specs, rows)]
        self.v = [_LayerCache(spec, v) for spec, (_, v) in zip(self.specs, rows)]
        self.bucket = {kind: _bucket(0, layout.slots(kind)) for kind in layout.kinds()}
        self.used = {kind: 0 for kind in layout.kinds()}  # rows [0, used) of each bucket hold data
        self.buffers = _Buffers(1, layout, vocab_size, hidden_size)
        self.binding = session.io_binding()
        self._bound = None  # (T, buckets) the binding was made for
        self._pending = 0  # T of the last forward (its new rows sit in buffers.new)
        self.generation = 0  # bumped whenever a cache view moves (the drafter rebinds then)
        self.kernel_s = 0.0  # seconds spent inside onnxruntime (the rest of a step is Python)

    @property
    def identity(self) -> str:
        """What kernels run (library, version, provider, threads): part of the host check's cache key."""
        return getattr(self.session, "_edge_spec_identity", "onnxruntime")

    @property
    def bucket_size(self) -> int:
        """Cache slots are bound in multiples of this: the host check probes verify passes across its edges."""
        return BUCKET

    # -- cache views -------------------------------------------------------------------------------
    def cache_views(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        b = self.bucket[self.specs[i].kind]
        return self.k[i].view(b), self.v[i].view(b)

    def _fit(self, kind: str, used: int, need: int) -> None:
        """Make the bound prefix of `kind` the bucket for `need` visible slots, keeping rows [0, used)."""
        new = _bucket(need, self.layout.slots(kind))
        old = self.bucket[kind]
        if new == old:
            return
        for i, spec in enumerate(self.specs):
            if spec.kind == kind:
                self.k[i].relayout(old, new, min(used, old, new))
                self.v[i].relayout(old, new, min(used, old, new))
        self.bucket[kind] = new
        self.generation += 1

    # -- Backend protocol ----------------------------------------------------------------------------
    def forward(self, input_ids: np.ndarray, position_ids: np.ndarray, masks: dict[str, np.ndarray],
                n_cached: int, last_only: bool) -> StepOutput:
        t = input_ids.shape[1]
        for kind in self.layout.kinds():
            used = min(n_cached, self.layout.slots(kind))  # slots >= used are empty (see kv.KVState.rewind)
            # the graph writes the new rows into their slots (position, or position % ring): until a ring wraps
            # these are slots used..used+t-1 of the bound prefix (a split-form graph just gets a few more slots)
            self._fit(kind, used, used + t)
            self.used[kind] = used
        if t > self.buffers.t_cap:
            self.buffers = _Buffers(max(t, 2 * self.buffers.t_cap), self.layout, self.vocab, self.hidden_size)
            self._bound = None
        buf = self.buffers
        buf.ids[:t] = input_ids[0]
        buf.pos[:t] = position_ids[0]
        mask_views = {}
        for kind, mask in masks.items():  # [1, 1, T, S + T] -> the bound [1, 1, T, b + T]
            s, b = self.layout.slots(kind), self.bucket[kind]
            view = buf.masks[kind][:t * (b + t)].reshape(1, 1, t, b + t)
            view[..., :b] = mask[..., :b]
            view[..., b:] = mask[..., s:]
            mask_views[kind] = view
        signature = (t, buf.t_cap, tuple(sorted(self.bucket.items())))
        if signature != self._bound:
            self._rebind(t, mask_views)
            self._bound = signature
        start = time.perf_counter()
        self.session.run_with_iobinding(self.binding)
        self.kernel_s += time.perf_counter() - start
        self._pending = t
        rows = slice(t - 1, t) if last_only else slice(0, t)
        logits = buf.logits[:t * self.vocab].reshape(t, self.vocab)[rows].copy()
        hidden = buf.hidden[:t * self.hidden_size].reshape(t, self.hidden_size)[rows].copy()
        return StepOutput(logits, hidden)

    def _rebind(self, t: int, mask_views: dict[str, np.ndarray]) -> None:
        buf, bind = self.buffers, self.binding
        bind.clear_binding_inputs()
        bind.clear_binding_outputs()
        _bind(bind, kv.INPUT_IDS, buf.ids[:t].reshape(1, t))
        _bind(bind, kv.POSITION_IDS, buf.pos[:t].reshape(1, t))
        for kind, view in mask_views.items():
            _bind(bind, kv.mask_name(kind), view)
        for i, spec in enumerate(self.specs):
            k, v = self.cache_views(i)
            _bind(bind, kv.k_cache_name(spec.layer), k)
            _bind(bind, kv.v_cache_name(spec.layer), v)
        _bind(bind, kv.LOGITS, buf.logits[:t * self.vocab].reshape(1, t, self.vocab), output=True)
        _bind(bind, kv.HIDDEN, buf.hidden[:t * self.hidden_size].reshape(1, t, self.hidden_size), output=True)
        for spec, (k, v) in zip(self.specs, buf.new):
            shape = (1, spec.num_kv_heads, t, spec.head_dim)
            _bind(bind, kv.k_new_name(spec.layer), k[:int(np.prod(shape))].reshape(shape), output=True)
            _bind(bind, kv.v_new_name(spec.layer), v[:int(np.prod(shape))].reshape(shape), output=True)

    def commit(self, plan: dict[str, tuple[np.ndarray, np.ndarray]]) -> None:
        assert self._pending, "commit without a forward"
        t = self._pending
        for kind, (rows, slots) in plan.items():
            if len(slots):
                self._fit(kind, self.used[kind], max(self.used[kind], int(slots.max()) + 1))
                self.used[kind] = max(self.used[kind], int(slots.max()) + 1)
        for key, idx in self.groups.items():
            kind, heads, dim, _ = key
            rows, slots = plan[kind]
            if not len(rows):
                continue
            cache = _stacked(self.stores[key], heads, self.bucket[kind], dim)  # [2n, H_kv, b, D]
            new = _stacked(self.buffers.new_store[key], heads, t, dim)  # [2n, H_kv, T, D]
            r0, s0, n = int(rows[0]), int(slots[0]), len(rows)
            if rows[-1] - r0 == n - 1 and slots[-1] - s0 == n - 1:  # runs of rows -> runs of slots: slices
                cache[:, :, s0:s0 + n] = new[:, :, r0:r0 + n]
            else:  # a sliding ring wrapping around
                cache[:, :, slots] = new[:, :, rows]
        self._pending = 0

    def reset(self) -> None:
        self._pending = 0


class OrtDrafter:
    """edge_spec.backend.DrafterBackend over the bundle's drafter graph, reading the OrtBackend's caches."""

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
        self.masks = {kind: np.zeros(target.layout.slots(kind), dtype=np.float32) for kind in self.sources}
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
            view[...] = masks[kind][..., :b]
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
    binding.bind_input(name, "cpu", 0, np.float32, list(table.shape), table.ctypes.data)
