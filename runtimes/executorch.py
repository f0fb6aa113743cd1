"""ExecuTorch runtime: the Backend and DrafterBackend over one .pte's `target` and `drafter` methods (XNNPACK, CPU),
which share the program's KV-cache buffers (the contract's `state` binding, exporters/executorch.py).

The program writes every row of a forward into its caches itself, so `commit` only accepts (KVState masks the
rows it did not accept) and nothing is copied per step. Each forward attends over the first S_kind slots of each
cache, S_kind = the smallest multiple of BUCKET that holds every key visible to the pass and the slots it writes
(the whole ring once a ring wraps): the runtime passes that many mask columns and the program slices its buffers to
them, so attention cost follows the context in use. Both methods are loaded once and never run at the same time
(executorch's Python Program plans one arena per memory id across the methods it loaded).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

from edge_spec.contract import kv
from edge_spec.contract.backend import DraftStep, StepOutput
from edge_spec.contract.eagle3_rows import Eagle3Drafting
from edge_spec.contract.manifest import EAGLE3, EAGLE3_FC_GRAPH
from edge_spec.errors import BundleError, ConfigError
from edge_spec.contract.kv import KVLayout
from edge_spec.logs import IMPORT_NOISE, quiet

BUCKET = 64
_FIX = "re-export the bundle: edge-spec export --format executorch --out DIR"


def _torch():
    import torch

    return torch


def load_program(path: Path, data: Path | None = None):
    """The .pte (with its weights file `data`, when the program keeps its constants there) as an executorch Program
    (custom LLM ops registered first), or a BundleError naming the file."""
    capi = sys.modules.get("edge_spec.runtimes.native_capi")
    if capi is not None and capi.loaded:
        raise ConfigError(f"cannot run {path} with the Python executorch runtime in this process: it loaded the native "
                          f"runner's library ({capi.loaded[0]}), and both register llama::update_cache_* (ExecuTorch "
                          "would abort the process)", capi.ONE_PER_PROCESS_FIX)
    try:
        with quiet(*IMPORT_NOISE):
            import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401  (kernels of llama::update_cache_*)
            import executorch.kernels.quantized  # noqa: F401  (quantized_decomposed::embedding_*: 8da4w tables)
            from executorch.runtime import Runtime
    except ImportError as err:
        raise ConfigError(f"the executorch runtime is not installed ({err.name or err})",
                          "pip install executorch==1.5.1") from err
    for file in (path, data):
        if file is not None and not file.is_file():
            raise BundleError(f"{file} is missing", _FIX)
    try:
        return Runtime.get().load_program(path, data_path=data)
    except Exception as err:  # executorch raises RuntimeError / ValueError with its own error codes
        weights = f" with its weights file {data.name}" if data is not None else ""
        raise BundleError(f"{path}: executorch cannot load this program{weights} "
                          f"({str(err).strip()[:200] or type(err).__name__})",
                          f"the files are not a valid .pte / .ptd pair for this runtime; {_FIX}") from err


def _load_method(program, name: str, path: Path, n_inputs: int, n_outputs: int):
    if name not in program.method_names:
        raise BundleError(f"{path} has no method {name!r} (it has {', '.join(sorted(program.method_names))})", _FIX)
    meta = program.metadata(name)
    if meta.num_inputs() != n_inputs or meta.num_outputs() != n_outputs:
        raise BundleError(f"{path}: method {name!r} takes {meta.num_inputs()} inputs and returns {meta.num_outputs()}, "
                          f"the manifest says {n_inputs} and {n_outputs}", _FIX)
    try:
        return program.load_method(name)
    except Exception as err:
        raise BundleError(f"{path}: executorch cannot load method {name!r} ({str(err).strip()[:200]})", _FIX) from err


def set_threads(threads: int | None) -> int:
    """XNNPACK's thread pool size (process-wide in executorch's Python bindings); returns the count in use."""
    from executorch.extension.pybindings import portable_lib

    if threads is not None:
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ConfigError(f"threads must be an integer >= 1, got {threads!r}")
        if threads != portable_lib._threadpool_get_thread_count():
            portable_lib._unsafe_reset_threadpool(threads)
    return portable_lib._threadpool_get_thread_count()


def open_bundle(folder: Path, manifest, layout: KVLayout, *, threads: int | None = None,
                spin: bool = True) -> tuple["ExecutorchBackend", "ExecutorchDrafter | None"]:
    """The runtime half of the executorch format (edge_spec.contract.formats). `spin` has no meaning here (XNNPACK's pool)."""
    entry = manifest.graphs["target"]
    path = folder / entry.file
    program = load_program(path, folder / entry.data if entry.data else None)
    count = set_threads(threads)
    target = _load_method(program, entry.method, path, len(entry.io.inputs), len(entry.io.outputs))
    import executorch

    identity = f"executorch {getattr(executorch, '__version__', '1.5.1')}, XNNPACK, {count} threads"
    backend = ExecutorchBackend(program, target, layout, manifest.vocab_size, manifest.hidden_size, identity,
                                kv.has_logit_rows(entry.io), kv.aux_size(entry.io))
    if manifest.drafter is None:
        return backend, None
    if manifest.drafter.kind == EAGLE3:  # its step and fc methods over its own buffers
        step, fc = (manifest.graphs[name] for name in ("drafter", EAGLE3_FC_GRAPH))
        methods = [_load_method(program, e.method, folder / e.file, len(e.io.inputs), len(e.io.outputs))
                   for e in (step, fc)]
        return backend, ExecutorchEagle3Drafter(*methods, backend, manifest.drafter.draft_layout)
    d = manifest.graphs["drafter"]
    drafter = _load_method(program, d.method, folder / d.file, len(d.io.inputs), len(d.io.outputs))
    sources = {kind: int(layer) for kind, layer in manifest.drafter.kv_sharing.items()}
    return backend, ExecutorchDrafter(drafter, backend, sources)


class ExecutorchBackend:
    """edge_spec.contract.backend.Backend over the program's `target` method (the program owns the caches)."""

    name = "executorch"

    def __init__(self, program, method, layout: KVLayout, vocab_size: int, hidden_size: int, identity: str,
                 logit_rows: bool = False, aux_width: int = 0):
        self.program, self.method, self.layout = program, method, layout  # the program must outlive its methods
        self.logit_rows = logit_rows  # the method takes kv.LOGIT_ROWS (programs exported since 2026-12-05)
        # an eagle3 program's target also returns kv.AUX_HIDDEN [1, T, aux_width]; after each pass `aux_sink` (set by
        # the eagle3 drafter) gets (ids [T], positions [T], aux rows [T, aux_width])
        self.aux_width, self.aux_sink = aux_width, None
        self.vocab, self.hidden_size = vocab_size, hidden_size
        self.identity = identity  # what kernels run: part of the host check's cache key
        self.bucket = {kind: kv.bucket_slots(0, layout.slots(kind), BUCKET) for kind in layout.kinds()}
        self.kernel_s = 0.0  # seconds inside executorch

    @property
    def bucket_size(self) -> int:
        """The host check probes verify passes across the edges of the slots attended (multiples of this)."""
        return BUCKET

    def forward(self, input_ids: np.ndarray, position_ids: np.ndarray, masks: dict[str, np.ndarray],
                n_cached: int, last_only: bool) -> StepOutput:
        torch = _torch()
        t = input_ids.shape[1]
        inputs = [torch.from_numpy(np.ascontiguousarray(input_ids)), torch.from_numpy(np.ascontiguousarray(position_ids))]
        for kind in self.layout.kinds():  # [1, 1, T, S + T] -> the attended [1, 1, T, b + T]
            s = self.layout.slots(kind)
            b = self.bucket[kind] = kv.bucket_slots(min(s, n_cached + t), s, BUCKET)
            mask = masks[kind]
            inputs.append(torch.from_numpy(np.concatenate([mask[..., :b], mask[..., s:]], axis=-1)))
        last = last_only and t > 1 and self.logit_rows  # the method runs the head on the last row only
        if self.logit_rows:  # [R]: T - 1 alone, or every row
            inputs.append(torch.tensor([t - 1]) if last else torch.arange(t))
        start = time.perf_counter()
        logits, hidden, *aux = self.method.execute(inputs)
        self.kernel_s += time.perf_counter() - start
        if aux and self.aux_sink is not None:
            self.aux_sink(input_ids[0], position_ids[0], aux[0][0].numpy())
        r = logits.shape[1]  # rows returned
        rows = slice(r - 1, r) if last_only else slice(0, r)
        return StepOutput(logits[0, rows].numpy().copy(), hidden[0, rows].numpy().copy())

    def commit(self, plan: dict[str, tuple[np.ndarray, np.ndarray]]) -> None:
        """Nothing to write: the program wrote every row of the last forward; KVState records which it accepted."""

    def reset(self) -> None:
        """Nothing to drop: the buffers keep stale rows, which KVState's masks hide."""


class ExecutorchDrafter:
    """edge_spec.contract.backend.DrafterBackend over the program's `drafter` method, reading the target's cache buffers."""

    def __init__(self, method, target: ExecutorchBackend, sources: dict[str, int]):
        self.method, self.target = method, target
        self.kinds = sorted(sources)
        self.kernel_s = 0.0
        self._inputs = None

    def begin(self, position: int, masks: dict[str, np.ndarray], n_cached: int) -> None:
        torch = _torch()
        views = []
        for kind in self.kinds:  # the committed keys: the first b slots hold them all
            s = self.target.layout.slots(kind)
            b = kv.bucket_slots(min(s, n_cached), s, BUCKET)
            views.append(torch.from_numpy(np.ascontiguousarray(masks[kind][..., :b])))
        self._inputs = [torch.tensor([[position]], dtype=torch.long), views]

    def step(self, token: int, hidden: np.ndarray) -> DraftStep:
        torch = _torch()
        position, masks = self._inputs
        inputs = [torch.tensor([[token]], dtype=torch.long), torch.from_numpy(hidden.reshape(1, 1, -1).astype(np.float32)),
                  position, *masks]
        start = time.perf_counter()
        ids, logits, nxt = self.method.execute(inputs)
        self.kernel_s += time.perf_counter() - start
        return DraftStep(ids.numpy().copy(), logits.numpy().copy(), nxt[0, 0].numpy().copy())


class ExecutorchEagle3Drafter(Eagle3Drafting):
    """DrafterBackend over an eagle3 program's `drafter` (step) and `drafter_fc` methods: the drafter's cache is the
    program's own buffers (draft layout `state`), which the step method writes at each row's slot, position - 1; which
    rows a step runs: edge_spec/contract/eagle3_rows.py (runtimes/ort_eagle3.py is the `io` twin). A burst's first
    step runs its rows in chunks of at most max_pass (the methods' planned size)."""

    def __init__(self, step_method, fc_method, target: ExecutorchBackend, draft: KVLayout):
        if not target.aux_width:
            raise BundleError(f"the target method returns no {kv.AUX_HIDDEN}, which an eagle3 drafter reads", _FIX)
        super().__init__(target, draft.max_context)  # slots: max_context + 1
        self.method, self.fc, self.draft = step_method, fc_method, draft

    def step(self, token: int, hidden: np.ndarray) -> DraftStep:
        rows = self.rows.next(token)
        if rows.first:  # the missing rows, max_pass at a time: fc over their aux states, then the step
            for a in range(0, len(rows.ids), self.draft.max_pass):
                ids = rows.ids[a:a + self.draft.max_pass]
                start = rows.aux_from + a
                x = self._execute(self.fc, [np.ascontiguousarray(self.record.aux[start:start + len(ids)][None])])[0]
                out = self._run(ids, x, rows.s + a)
        else:
            out = self._run(rows.ids, np.asarray(hidden, dtype=np.float32).reshape(1, 1, -1), rows.s)
        self.rows.wrote(rows)
        token_ids, logits, out_hidden = out
        return DraftStep(token_ids, logits, out_hidden[0, 0].copy())

    def _run(self, ids: np.ndarray, hidden, s: int):
        """T rows after the s written ones: ids [T], hidden [1, T, H] -> (token ids [Vd], logits [Vd], hidden
        [1, 1, H]); the mask [1, 1, T, b + T] shows the written slots [0, s) and the new rows causally."""
        t, slots = len(ids), self.draft.max_context
        b = kv.bucket_slots(min(slots, s + t), slots, BUCKET)
        mask = np.full((1, 1, t, b + t), kv.NEG_INF, dtype=np.float32)
        mask[..., :s] = 0.0
        mask[0, 0, :, b:] = np.where(np.tri(t, dtype=bool), np.float32(0.0), kv.NEG_INF)
        positions = np.arange(s + 1, s + 1 + t, dtype=np.int64)[None]
        return self._execute(self.method, [ids.astype(np.int64)[None], hidden, positions, mask])

    def _execute(self, method, arrays: list) -> list[np.ndarray]:
        torch = _torch()
        start = time.perf_counter()
        out = method.execute([torch.from_numpy(np.ascontiguousarray(a)) for a in arrays])
        self.kernel_s += time.perf_counter() - start
        return [o.numpy().copy() for o in out]
