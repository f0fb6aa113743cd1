"""QNN runtime: the Backend and DrafterBackend over a qnn bundle's fixed-shape graphs (exporters/qnn.py), `io` binding
(edge_spec.runtimes.fixed pads each pass to the next exported length and holds the caches).

Providers (`--provider`):
  * `qnn` (default): the EPContext models (`qnn/<graph>.ctx.onnx`, the context binaries compiled for the bundle's
    SoC) on onnxruntime's QNN execution provider, CPU fallback disabled: a graph that does not fully land on the HTP
    fails to open. On x86-64 the wheel simulates the HTP (slow: for verification); on a Snapdragon phone the same
    files run on its NPU (docs/android-qnn.md).
  * `cpu`: the QDQ models (`qnn/<graph>.qdq.onnx`) on onnxruntime's CPU provider: the numerical reference of the
    quantized graphs, and a way to run the bundle where the QNN wheel is missing.
Either way, a pass from position 0 runs that one row through `qnn/target_sink.onnx` on the CPU provider (the
shortest target graph with float activations and the same 8-bit weights, exporters/qnn.float_twin; the row is padded
like any pass) and the rest of the pass on the
provider: the first token's massive activation never enters a quantized graph.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edge_spec.runtimes import qnn_htp
from edge_spec.errors import BundleError, ConfigError
from edge_spec.runtimes.fixed import FixedBackend, FixedDrafter, Predictor, fixed_shapes
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
    lengths, slots = fixed_shapes(entry, layout, "QNN bundle")
    file = qnn_htp.ctx_file if provider == "qnn" else qnn_htp.qdq_file
    sessions = {t: open_session(folder / file(name), provider, soc, threads) for t, name in lengths.items()}
    where = f"HTP {soc.name} (v{soc.htp_arch}), {qnn_htp.versions()}" if provider == "qnn" else "CPU provider"
    import onnxruntime as ort

    sink = info.get("host_sink")  # position 0 on the host CPU, float activations (bundles since 2026-12-02)
    identity = f"qnn {info['quant']} QDQ on {where}{', position 0 on the CPU' if sink else ''}, onnxruntime " \
        f"{ort.__version__}, threads {threads or 'default'}"
    backend = FixedBackend({t: _predictor(s) for t, s in sessions.items()}, layout, slots, identity, name="qnn",
                           mask_floor=float(info["mask_floor"]), fix="re-export with --max-pass", placed=True,
                           sink=_predictor(open_session(folder / sink, "cpu", soc, threads)) if sink else None)
    if manifest.drafter is None:
        return backend, None
    method = manifest.graphs["drafter"].method
    drafter = _predictor(open_session(folder / file(method), provider, soc, threads))
    sources = {kind: int(layer) for kind, layer in manifest.drafter.kv_sharing.items()}
    return backend, FixedDrafter(drafter, backend, sources)

