"""QNN runtime: the Backend and DrafterBackend over a qnn bundle's fixed-shape graphs (exporters/qnn.py), `io` binding
(edge_spec.runtimes.fixed pads each pass to the next exported length and holds the caches).

Providers (`--provider`):
  * `qnn` (default): the EPContext models (`qnn/<graph>.ctx.onnx`, the context binaries compiled for the bundle's
    SoC) on onnxruntime's QNN execution provider, CPU fallback disabled: a graph that does not fully land on the HTP
    fails to open. On x86-64 the wheel simulates the HTP (slow: for verification); on a Snapdragon phone the same
    files run on its NPU (docs/android-qnn.md).
  * `cpu`: the QDQ models (`qnn/<graph>.qdq.onnx`) on onnxruntime's CPU provider: the numerical reference of the
    quantized graphs, and a way to run the bundle where the QNN wheel is missing.
An eagle3 drafter (exporters/qnn.py): its step and fc graphs at each of the target's lengths, run by
runtimes/fixed_eagle3.py over its own cache (held here) beside the backend, which hands it every pass's aux states.
Either way, a pass from position 0 runs that one row through `qnn/target_sink.onnx` on the CPU provider (the
shortest target graph with float activations and the same 8-bit weights, exporters/qnn.float_twin; the row is padded
like any pass) and the rest of the pass on the
provider: the first token's massive activation never enters a quantized graph. A bundle exported with
`--qnn-position0 table` (for a phone: no QDQ graphs, no sink, no second copy of the weights) instead reads that row
from `qnn/position0.bin`, precomputed by the same sink for the chat template's first token and BOS (`table_sink`);
a prompt starting with another token runs its first row through the quantized graphs, with a notice.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edge_spec.runtimes import qnn_htp
from edge_spec.errors import BundleError, ConfigError
from edge_spec.contract.manifest import EAGLE3, EAGLE3_FC_GRAPH
from edge_spec.runtimes.fixed import FixedBackend, FixedDrafter, Predictor, fixed_shapes
from edge_spec.runtimes.fixed_eagle3 import FixedEagle3Drafter
from edge_spec.contract import kv
from edge_spec.contract.kv import KVLayout

PROVIDERS = ("qnn", "cpu")
_FIX = "re-export the bundle: edge-spec export --format qnn --out DIR"


def _predictor(session) -> Predictor:
    names = [o.name for o in session.get_outputs()]

    def run(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(zip(names, session.run(None, feeds)))

    return run


def open_session(path: Path, provider: str, soc: qnn_htp.Soc, threads: int | None = None):
    """An onnxruntime session of one graph file on `provider` (qnn: the HTP only, or a clear error)."""
    if not path.is_file():
        raise BundleError(f"{path} is missing from the bundle", _FIX)
    if provider == "qnn":
        ort, _ = qnn_htp.import_qnn()
        so = qnn_htp.session_options(soc, threads=threads)
    else:
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.log_severity_level = 3
        if threads:
            so.intra_op_num_threads = threads
    try:
        session = ort.InferenceSession(str(path), so, providers=None if provider == "qnn" else ["CPUExecutionProvider"])
    except Exception as err:
        text = str(err).strip()
        if "fallback to CPU EP has been explicitly disabled" in text:
            raise BundleError(f"{path}: part of the graph would run outside the HTP ({soc.name})",
                              "re-export for this SoC, or run it with --provider cpu") from err
        raise BundleError(f"{path}: onnxruntime cannot load it ({text[:300]})", _FIX) from err
    if provider == "qnn" and (off := qnn_htp.cpu_nodes(session)):
        raise BundleError(f"{path}: {len(off)} node(s) placed off the HTP: {', '.join(off[:5])}", _FIX)
    return session


def table_sink(folder: Path, entry: dict, layout: KVLayout, vocab_size: int, hidden_size: int, aux_width: int = 0
               ) -> tuple[Predictor, frozenset[int]]:
    """Position 0 from `qnn/position0.bin` (`qnn_htp.position0_file`: rows precomputed at export for a few first
    tokens): a predictor returning what the host sink would for a pass of one of those tokens at position 0, and the
    tokens it holds. Its outputs hold row 0 only (the runtime reads no other row of a first pass's sink call)."""
    tokens = [int(t) for t in entry["tokens"]]
    path = folder / entry["file"]
    if not path.is_file():
        raise BundleError(f"{path} is missing from the bundle", _FIX)
    per = qnn_htp.position0_floats(layout, vocab_size, hidden_size, aux_width)
    data = np.fromfile(path, dtype="<f4")
    if data.size != per * len(tokens):
        raise BundleError(f"{path} holds {data.size} floats; {len(tokens)} tokens of this bundle's shapes need "
                          f"{per * len(tokens)}", _FIX)
    rows = data.reshape(len(tokens), per)
    index = {t: i for i, t in enumerate(tokens)}
    names = [kv.LOGITS, kv.HIDDEN] + [name(c.layer) for c in layout.caches for name in (kv.k_new_name, kv.v_new_name)]
    sizes = [vocab_size, hidden_size] + [c.num_kv_heads * c.head_dim for c in layout.caches for _ in range(2)]
    shapes = [(1, 1, vocab_size), (1, 1, hidden_size)] + \
        [(1, c.num_kv_heads, 1, c.head_dim) for c in layout.caches for _ in range(2)]
    if aux_width:  # an eagle3 bundle's target: its aux states last
        names, sizes, shapes = names + [kv.AUX_HIDDEN], sizes + [aux_width], shapes + [(1, 1, aux_width)]
    offsets = np.cumsum([0] + sizes)

    def run(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        row = rows[index[int(feeds[kv.INPUT_IDS][0, 0])]]
        return {n: row[a:b].reshape(shape) for n, a, b, shape in zip(names, offsets, offsets[1:], shapes)}

    return run, frozenset(tokens)


def open_bundle(folder: Path, manifest, layout: KVLayout, *, threads: int | None = None, provider: str | None = None,
                spin: bool = True) -> tuple[FixedBackend, FixedDrafter | None]:
    """The runtime half of the qnn format (edge_spec.contract.formats). `spin`: not QNN's (ignored)."""
    provider = provider or "qnn"
    if provider not in PROVIDERS:
        raise ConfigError(f"the qnn runtime has no provider {provider!r}",
                          "use --provider qnn (the HTP) or --provider cpu (the QDQ reference on the CPU)")
    entry = manifest.graphs["target"]
    info = (entry.fixed or {}).get("qnn")
    if not entry.fixed or "lengths" not in entry.fixed or not info:
        raise BundleError(f"{folder}: the qnn target entry lists no fixed pass lengths or SoC", _FIX)
    soc = qnn_htp.get_soc(info["soc"])
    if provider == "cpu" and not info.get("cpu_graphs", True):
        raise ConfigError(f"{folder} was exported for a phone (--qnn-position0 table): it holds no QDQ graphs for the "
                          "CPU provider", "run it with --provider qnn, or re-export with --qnn-position0 graph")
    lengths, slots = fixed_shapes(entry, layout, "QNN bundle")
    file = qnn_htp.ctx_file if provider == "qnn" else qnn_htp.qdq_file
    sessions = {t: open_session(folder / file(name), provider, soc, threads) for t, name in lengths.items()}
    where = f"HTP {soc.name} (v{soc.htp_arch}), {qnn_htp.versions()}" if provider == "qnn" else "CPU provider"
    import onnxruntime as ort

    aux = kv.aux_size(entry.io)  # an eagle3 bundle's target returns its aux states
    sink, tokens, how = None, None, ""
    if info.get("host_sink"):  # position 0 on the host CPU, float activations (bundles since 2026-12-02)
        sink, how = _predictor(open_session(folder / info["host_sink"], "cpu", soc, threads)), ", position 0 on the CPU"
    elif info.get("position0"):  # position 0 precomputed for some first tokens (--qnn-position0 table)
        sink, tokens = table_sink(folder, info["position0"], layout, manifest.vocab_size, manifest.hidden_size, aux)
        how = f", position 0 precomputed for tokens {sorted(tokens)}"
    identity = f"qnn {info['quant']} QDQ on {where}{how}, onnxruntime {ort.__version__}, threads {threads or 'default'}"
    backend = FixedBackend({t: _predictor(s) for t, s in sessions.items()}, layout, slots, identity, name="qnn",
                           mask_floor=float(info["mask_floor"]), fix="re-export with --max-pass", placed=True,
                           sink=sink, sink_tokens=tokens, aux_width=aux)
    if manifest.drafter is None:
        return backend, None
    if manifest.drafter.kind == EAGLE3:  # its step and fc graphs at each length, over its own cache (fixed_eagle3)
        graphs = {}
        for g in ("drafter", EAGLE3_FC_GRAPH):
            named = {int(t): n for t, n in (manifest.graphs[g].fixed or {}).get("lengths", {}).items()}
            if not named:
                raise BundleError(f"{folder}: the eagle3 drafter's {g!r} entry lists no fixed lengths", _FIX)
            graphs[g] = {t: _predictor(open_session(folder / file(n), provider, soc, threads)) for t, n in named.items()}
        return backend, FixedEagle3Drafter(graphs["drafter"], graphs[EAGLE3_FC_GRAPH], backend,
                                           manifest.drafter.draft_layout, mask_floor=float(info["mask_floor"]))
    method = manifest.graphs["drafter"].method
    drafter = _predictor(open_session(folder / file(method), provider, soc, threads))
    sources = {kind: int(layer) for kind, layer in manifest.drafter.kv_sharing.items()}
    return backend, FixedDrafter(drafter, backend, sources)

