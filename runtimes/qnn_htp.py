"""Qualcomm HTP through onnxruntime's QNN execution provider: what the qnn exporter (compiling context binaries) and
the qnn runtime (running them) share. One table of SoCs, one table of quantization schemes, one session recipe.

The `onnxruntime-qnn` wheel (2.7.0, QNN SDK 2.51) is a *plugin* EP: it is registered from its library
(`ort.register_execution_provider_library`) and attached with `SessionOptions.add_provider_for_devices`; the old
`providers=["QNNExecutionProvider"]` argument silently runs everything on the CPU (measured: docs/qnn-probe.md).
Its x86-64 build simulates the HTP (it prepares graphs and executes them, slowly): what runs here is what the phone's
HTP would run, at about 65-80 ms per million weights per token. The QNN libraries are under Qualcomm's AI Stack
licence (no standalone redistribution): depend on the wheel, never copy them.
"""

from __future__ import annotations

from dataclasses import dataclass

from edge_spec.errors import ConfigError

EP_NAME = "QNNExecutionProvider"
INSTALL = "pip install onnxruntime-qnn==2.7.0 (x86-64 Linux / Windows on Snapdragon; Android: onnxruntime's QNN AAR)"


@dataclass(frozen=True)
class Soc:
    name: str
    soc_model: int  # QNN's SoC id (the EP's `soc_model` option)
    htp_arch: int  # Hexagon architecture version (v75 = 75)
    marketing: str


SOCS = {s.name: s for s in (
    Soc("sm8350", 30, 68, "Snapdragon 888"),
    Soc("sm8450", 36, 69, "Snapdragon 8 Gen 1"),
    Soc("sm8550", 43, 73, "Snapdragon 8 Gen 2"),
    Soc("sm8650", 57, 75, "Snapdragon 8 Gen 3 (Galaxy S24)"),
    Soc("sm8750", 69, 79, "Snapdragon 8 Elite"),
)}
DEFAULT_SOC = "sm8650"
# --quant -> (activation type, weight type) names of onnxruntime.quantization.QuantType
QUANTS = {"16a8w": ("QUInt16", "QUInt8"), "8a8w": ("QUInt8", "QUInt8")}
# masked attention entries fed to a quantized graph: the mask input's calibrated range is [MASK_FLOOR, 0], so a
# 16-bit activation resolves 100 / 65535 = 0.0015 in the scores; exp(-100) is 0 against any real score (and the
# graph's exact 0 / 1 `keep` input zeroes masked scores and probabilities). kv.NEG_INF (-1e30) would flatten every score.
MASK_FLOOR = -100.0

# bundle layout: qnn/<graph>.qdq.onnx (portable QDQ) and qnn/<graph>.ctx.onnx (EPContext for the bundle's SoC)
QNN_DIR = "qnn"
DRAFTER_GRAPH = "drafter"


def target_graph(t: int) -> str:
    return f"target_{t}"


def eagle3_step_graph(t: int) -> str:  # an eagle3 drafter's step graph at T = t (exporters/static.Eagle3StepFunction)
    return f"{DRAFTER_GRAPH}_{t}"


def eagle3_fc_graph(t: int) -> str:  # ... and its fc graph (Eagle3FcFunction)
    return f"{DRAFTER_GRAPH}_fc_{t}"


def qdq_file(graph: str) -> str:
    return f"{QNN_DIR}/{graph}.qdq.onnx"


def ctx_file(graph: str) -> str:
    return f"{QNN_DIR}/{graph}.ctx.onnx"


def sink_file() -> str:  # position 0's pass on the host CPU: the shortest target graph's QDQ graph, float activations
    return f"{QNN_DIR}/target_sink.onnx"


def weights_file() -> str:  # the QDQ graphs' and the sink's initializers, each distinct tensor once (external data)
    return f"{QNN_DIR}/weights.data"


def position0_file() -> str:
    """Position 0's rows precomputed for a few first tokens (`--qnn-position0 table`): per token of the manifest's
    `fixed.qnn.position0.tokens`, in that order, float32 little-endian: logits [V], hidden [H], then per cache of the
    layout (its order) the new key row [H_kv, D] and value row [H_kv, D], then (an eagle3 bundle's target) its aux
    states [n * H] - what the host sink would return for a pass of that one token at position 0 (`position0_floats`).
    The C++ runner reads the same layout (qnn_backend.cpp; it runs no eagle3 QNN bundle)."""
    return f"{QNN_DIR}/position0.bin"


def position0_floats(layout, vocab_size: int, hidden_size: int, aux_width: int = 0) -> int:
    """Floats per token of `position0_file` (`aux_width`: the target's aux states, an eagle3 bundle's)."""
    return vocab_size + hidden_size + sum(2 * c.num_kv_heads * c.head_dim for c in layout.caches) + aux_width


def get_soc(name: str) -> Soc:
    if name not in SOCS:
        raise ConfigError(f"unknown Snapdragon SoC {name!r}",
                          "choose one of " + ", ".join(f"{s.name} ({s.marketing})" for s in SOCS.values()))
    return SOCS[name]


def import_qnn():
    """onnxruntime with the QNN plugin registered (once per process); returns (onnxruntime, onnxruntime_qnn)."""
    try:
        import onnxruntime as ort
        import onnxruntime_qnn as oq
    except ImportError as err:
        raise ConfigError(f"the QNN execution provider is not installed ({err.name or err})", INSTALL) from err
    if EP_NAME not in ort.get_available_providers():
        try:
            ort.register_execution_provider_library(oq.get_ep_name(), oq.get_library_path())
        except Exception as err:  # a second registration of the same name, or a broken wheel
            if EP_NAME not in ort.get_available_providers():
                raise ConfigError(f"onnxruntime could not load the QNN plugin ({err})", INSTALL) from err
    return ort, oq


def versions() -> str:
    _, oq = import_qnn()
    info = getattr(oq, "build_and_package_info", None)
    return f"onnxruntime-qnn {getattr(info, '__version__', '?')} (QNN {getattr(info, 'qnn_version', '?')})"


def session_options(soc: Soc, *, threads: int | None = None, fallback: bool = False):
    """SessionOptions that put the whole graph on the HTP of `soc` or fail: CPU fallback disabled (`fallback`:
    allowed, for diagnostics: `cpu_nodes` then lists what would not run on the HTP)."""
    ort, oq = import_qnn()
    devices = [d for d in ort.get_ep_devices() if d.ep_name == oq.get_ep_name()]
    if not devices:
        raise ConfigError("onnxruntime lists no QNN device on this machine", INSTALL)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.add_session_config_entry("session.disable_cpu_ep_fallback", "0" if fallback else "1")
    so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    if threads:
        so.intra_op_num_threads = threads
    so.add_provider_for_devices(devices, {"backend_type": "htp", "soc_model": str(soc.soc_model),
                                          "htp_arch": str(soc.htp_arch), "htp_performance_mode": "burst",
                                          "offload_graph_io_quantization": "0"})
    return so


def off_htp(path, soc: Soc) -> list[str]:
    """The nodes of the model at `path` that the QNN EP would leave to the CPU on `soc` (a diagnostic)."""
    ort, _ = import_qnn()
    session = ort.InferenceSession(str(path), session_options(soc, fallback=True))
    return cpu_nodes(session)


def cpu_nodes(session) -> list[str]:
    """The nodes of a session that did not land on the HTP ("op_type name"): empty when fully placed."""
    out = []
    for sub in session.get_provider_graph_assignment_info():
        if sub.ep_name != EP_NAME:
            out += [f"{n.op_type} {n.name}" for n in sub.get_nodes()]
    return out
