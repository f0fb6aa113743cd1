"""A format of this test's own, which no core module knows: the proof that a new format is two modules and a row.

The `toy` format: its exporter half writes a llama checkpoint's weights into one .npz; its runtime half (`toy-numpy`)
runs them in numpy, each row of a pass as its own one-token step (keys scattered into their cache slots first, so a
verify row sums exactly what a decode step sums: batch-invariant by construction), and drafts with the target itself
(a self-drafter over a scratch copy of the caches: lossless as any drafter, and greedy drafts are always accepted).
Both halves are this module (`__name__` in the row); the row declares one option per command. The test exports,
generates and checks through `edge_spec.cli.main` and the API, and checks that the toy's options reach its modules
and that the core refuses them for other formats, and other formats' options for the toy.
"""

from __future__ import annotations

import json
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest

import edge_spec
from edge_spec.api import load_bundle
from edge_spec.cli import main
from edge_spec.contract import bundle, formats, kv
from edge_spec.contract.backend import DraftStep, StepOutput
from edge_spec.contract.manifest import GraphEntry, read_manifest
from edge_spec.errors import BundleError, ConfigError, ExportError

NAME, RUNTIME, WEIGHTS = "toy", "toy-numpy", "toy/weights.npz"
ROW = formats.Format(
    NAME, ("fp32", "fp16"), kv.BINDING_IO, RUNTIME, __name__, __name__, "nothing to install (tests/test_toy_format.py)",
    about="numpy weights, drafting with the target itself", precision_help="fp32 or fp16 (stored in half, run in fp32)",
    options=(formats.Option(("--toy-compress",), "compress", "deflate the .npz", switch=True),
             formats.Option(("--toy-compute",), "compute", "the dtype it computes in: float32 (default) or float64",
                            formats.RUN, ("float32", "float64")),
             formats.Option(("--toy-report",), "report", "list the weights", formats.CHECK, switch=True)))


# ---- the exporter half ------------------------------------------------------------------------------------------
def export_steps(with_drafter: bool, **_) -> int:
    return bundle.COMMON_STEPS + 1


def writer(*, compress: bool = False) -> bundle.Writer:
    def write(job: bundle.ExportJob):
        from safetensors.numpy import load_file

        cfg = job.target.config
        if cfg.raw.get("model_type") != "llama" or any(c.window for c in job.layout.caches):
            raise ExportError("the toy format exports full-attention llama checkpoints only", "use another --format")
        if job.drafter is not None:
            raise ExportError("the toy format drafts with its target and takes no drafter", "pass --drafter none")
        job.step("writing the weights")
        dtype = np.float16 if job.precision == "fp16" else np.float32
        weights = {}
        for path in sorted(Path(job.target.folder).glob("*.safetensors")):
            weights.update({k: v.astype(dtype) for k, v in load_file(path).items()})
        (job.tmp / WEIGHTS).parent.mkdir()
        (np.savez_compressed if compress else np.savez)(job.tmp / WEIGHTS, **weights)
        return {"target": GraphEntry(WEIGHTS, job.precision, kv.target_io(job.layout, cfg.vocab_size,
                                                                           cfg.hidden_size))}, {}
    return write


# ---- the runtime half -------------------------------------------------------------------------------------------
def open_bundle(folder: Path, manifest, layout: kv.KVLayout, *, threads: int | None = None, spin: bool = True,
                compute: str = "float32"):
    if layout.kinds() != (kv.FULL,):
        raise BundleError(f"{folder}: the toy runtime runs full-attention targets only", "use another format")
    with np.load(folder / manifest.graphs["target"].file) as f:
        model = ToyModel(manifest.target.config, {k: f[k].astype(compute) for k in f.files})
    backend = ToyBackend(model, layout)
    return backend, ToyDrafter(backend)


def diagnose(folder: Path, manifest, *, threads: int | None = None, report: bool = False) -> str:
    with np.load(folder / manifest.graphs["target"].file) as f:
        return f"toy weights: {len(f.files)} arrays, {sum(f[k].size for k in f.files)} values" if report else ""


class ToyModel:
    """Llama in numpy, one row at a time: `row` is a one-token step over caches of S slots (slot = position)."""

    def __init__(self, cfg: dict, w: dict[str, np.ndarray]):
        self.w, self.layers, self.dtype = w, cfg["num_hidden_layers"], w["model.norm.weight"].dtype
        self.heads, self.kv_heads = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
        self.dim = cfg.get("head_dim") or cfg["hidden_size"] // self.heads
        self.eps = cfg.get("rms_norm_eps", 1e-6)
        theta = (cfg.get("rope_parameters") or {}).get("rope_theta", cfg.get("rope_theta", 10000.0))
        self.inv_freq = 1.0 / theta ** (np.arange(0, self.dim, 2, dtype=np.float64) / self.dim)
        self.head = w.get("lm_head.weight", w["model.embed_tokens.weight"])

    def norm(self, x: np.ndarray, name: str) -> np.ndarray:
        return (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * self.w[name]).astype(self.dtype)

    def rope(self, x: np.ndarray, pos: int) -> np.ndarray:  # [heads, dim], rotate-half convention
        angle = np.concatenate([pos * self.inv_freq] * 2)
        half = self.dim // 2
        rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
        return (x * np.cos(angle) + rotated * np.sin(angle)).astype(self.dtype)

    def project(self, x: np.ndarray, name: str) -> np.ndarray:
        return self.w[name] @ x  # one row: the same matrix-vector product whatever the pass

    def row(self, token: int, pos: int, keys: list, values: list, bias: np.ndarray):
        """Logits and hidden of `token` at `pos`; writes its K/V into slot `pos` of `keys` / `values` ([S, Hkv, D]
        per layer) and attends over all S slots, `bias` hiding the empty and stale ones."""
        x = self.w["model.embed_tokens.weight"][token]
        for i in range(self.layers):
            p = f"model.layers.{i}."
            h = self.norm(x, p + "input_layernorm.weight")
            q, k, v = (self.project(h, p + f"self_attn.{n}_proj.weight") for n in "qkv")
            keys[i][pos] = self.rope(k.reshape(self.kv_heads, self.dim), pos)
            values[i][pos] = v.reshape(self.kv_heads, self.dim)
            q = self.rope(q.reshape(self.heads, self.dim), pos)
            out = np.empty_like(q)
            for j in range(self.heads):
                g = j * self.kv_heads // self.heads
                scores = keys[i][:, g] @ q[j] / self.dtype.type(np.sqrt(self.dim)) + bias
                probs = np.exp(scores - scores.max())
                out[j] = (probs / probs.sum()) @ values[i][:, g]
            x = x + self.project(out.reshape(-1), p + "self_attn.o_proj.weight")
            h = self.norm(x, p + "post_attention_layernorm.weight")
            gate, up = self.project(h, p + "mlp.gate_proj.weight"), self.project(h, p + "mlp.up_proj.weight")
            x = x + self.project(gate / (1 + np.exp(-gate)) * up, p + "mlp.down_proj.weight")
        hidden = self.norm(x, "model.norm.weight")
        return self.head @ hidden, hidden


class ToyBackend:
    """edge_spec.contract.backend.Backend: caches [S, Hkv, D] per layer; a pass's new rows stay pending until commit."""

    name = RUNTIME

    def __init__(self, model: ToyModel, layout: kv.KVLayout):
        self.model, self.layout = model, layout
        shape = (layout.slots(kv.FULL), model.kv_heads, model.dim)
        self.k = [np.zeros(shape, model.dtype) for _ in range(model.layers)]
        self.v = [np.zeros(shape, model.dtype) for _ in range(model.layers)]
        self.pending = None
        self.kernel_s = 0.0
        self.identity = f"toy numpy {np.__version__}, {model.dtype}"

    def forward(self, input_ids, position_ids, masks, n_cached, last_only) -> StepOutput:
        start, s = time.perf_counter(), self.layout.slots(kv.FULL)
        keys, values = [k.copy() for k in self.k], [v.copy() for v in self.v]
        mask, positions = masks[kv.FULL][0, 0], position_ids[0]
        logits, hidden = [], []
        for i, (token, pos) in enumerate(zip(input_ids[0], positions)):
            bias = mask[i, :s].astype(self.model.dtype)
            bias[positions] = mask[i, s:]  # new keys sit in their own slots: row i sums what a decode step sums
            out = self.model.row(int(token), int(pos), keys, values, bias)
            logits.append(out[0])
            hidden.append(out[1])
        self.pending = positions.copy(), keys, values
        self.kernel_s += time.perf_counter() - start
        rows = slice(len(logits) - 1, None) if last_only else slice(None)
        return StepOutput(np.stack(logits)[rows].astype(np.float32), np.stack(hidden)[rows].astype(np.float32))

    def commit(self, plan) -> None:
        positions, keys, values = self.pending
        rows, slots = plan[kv.FULL]
        for i in range(self.model.layers):
            self.k[i][slots] = keys[i][positions[rows]]
            self.v[i][slots] = values[i][positions[rows]]
        self.pending = None

    def reset(self) -> None:
        self.pending = None


class ToyDrafter:
    """edge_spec.contract.backend.DrafterBackend drafting with the target's own rows over a scratch copy of its caches."""

    def __init__(self, target: ToyBackend):
        self.target, self.kernel_s = target, 0.0

    def begin(self, position: int, masks, n_cached: int) -> None:
        self.position = position
        self.keys, self.values = [k.copy() for k in self.target.k], [v.copy() for v in self.target.v]
        self.bias = masks[kv.FULL][0, 0, 0].astype(self.target.model.dtype)

    def step(self, token: int, hidden: np.ndarray) -> DraftStep:
        start = time.perf_counter()
        self.bias[self.position] = 0.0
        logits, hidden = self.target.model.row(token, self.position, self.keys, self.values, self.bias)
        self.position += 1
        self.kernel_s += time.perf_counter() - start
        return DraftStep(np.arange(len(logits)), logits.astype(np.float32), hidden.astype(np.float32))


# ---- the tests --------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def toy():
    with formats.registered(ROW):
        yield ROW


@pytest.fixture(scope="module")
def toy_bundle(toy, tiny_llama, tmp_path_factory):
    out = tmp_path_factory.mktemp("toy") / "bundle"
    assert main(["export", "--model", str(tiny_llama[0]), "--format", NAME, "--max-context", "64", "--out", str(out)]) == 0
    return out


def test_export_generate_and_check_through_the_cli(toy_bundle, tmp_path, capsys):
    manifest = read_manifest(toy_bundle)
    assert manifest.format == NAME and manifest.precision == "fp32" and manifest.drafter is None
    base = ["generate", "--bundle", str(toy_bundle), "--prompt", "w5 w6 w7 w5 w6", "--max-new-tokens", "16", "--quiet"]
    assert main(base) == 0
    spec = capsys.readouterr()
    assert main(base + ["--no-spec"]) == 0
    plain = capsys.readouterr()
    assert spec.out == plain.out and spec.out.strip()  # greedy speculative == plain, token for token
    assert f"[{RUNTIME}]" in spec.err and "tau" in spec.err and "tau" not in plain.err
    assert "speculative decoding is off" not in spec.err  # the host check found the toy exact
    report = tmp_path / "check.json"
    assert main(["check", "--bundle", str(toy_bundle), "--json", str(report), "--toy-report"]) == 0
    out = capsys.readouterr().out
    assert f"({NAME} fp32, runtime {RUNTIME})" in out and "toy weights: " in out
    result = json.loads(report.read_text())
    assert result["one_row_max_diff"] == 0.0 and result["format"] == f"{NAME} fp32"


def test_greedy_self_drafts_are_all_accepted_and_match_the_eager_reference(toy_bundle):
    toy_engine, eager = load_bundle(toy_bundle), load_bundle(toy_bundle, runtime="torch", host_check=False)
    ids = toy_engine.encode("w5 w6 w7 w8")
    spec = toy_engine.generate(ids, max_new_tokens=12, spec_k=3, adaptive=False, lookup=False)
    plain = toy_engine.generate(ids, max_new_tokens=12, speculative=False)
    assert spec.tokens == plain.tokens and spec.extra["spec"].tau > 3.5  # drafts by the target itself: all accepted
    toy_engine.session.reset()
    ours, ref = (e.session.prefill(ids).logits for e in (toy_engine, eager))
    np.testing.assert_allclose(ours, ref, atol=1e-4)  # the toy is llama: it agrees with the eager runtime


def test_the_toy_options_reach_its_modules_and_stay_its_own(toy, toy_bundle, tiny_llama, tmp_path, capsys):
    model = str(tiny_llama[0])
    compressed = tmp_path / "compressed"
    assert main(["export", "--model", model, "--format", NAME, "--quant", "fp16", "--toy-compress",
                 "--max-context", "64", "--out", str(compressed)]) == 0
    with zipfile.ZipFile(compressed / WEIGHTS) as z:
        assert {i.compress_type for i in z.infolist()} == {zipfile.ZIP_DEFLATED}
    assert load_bundle(toy_bundle, compute="float64", host_check=False).session.backend.model.dtype == np.float64
    refused = [
        (["export", "--model", model, "--format", "onnx", "--toy-compress", "--out", str(tmp_path / "x")],
         f"--toy-compress applies to --format {NAME}, not onnx"),
        (["export", "--model", model, "--format", NAME, "--soc", "sm8650", "--out", str(tmp_path / "x")],
         f"--soc applies to --format qnn, not {NAME}"),
        (["export", "--model", model, "--format", NAME, "--kv", "state", "--out", str(tmp_path / "x")],
         "no KV binding 'state'"),
        (["generate", "--bundle", str(toy_bundle), "--provider", "cpu", "--prompt", "w5"],
         f"--provider applies to onnx and qnn bundles, not the {RUNTIME} runtime"),
        (["generate", "--bundle", str(toy_bundle), "--runtime", "torch", "--toy-compute", "float64", "--prompt", "w5"],
         f"--toy-compute applies to {NAME} bundles, not the torch runtime"),
        (["check", "--model", model, "--toy-report"], f"--toy-report applies to {NAME} bundles, not the torch runtime"),
    ]
    for args, message in refused:
        assert main(args) == 2, args
        err = capsys.readouterr().err
        assert message in err and ("fix: drop" in err or "fix: choose" in err), err
    assert not (tmp_path / "x").exists()


def test_the_row_is_all_the_core_learns(toy, capsys):
    with pytest.raises(SystemExit):
        main(["export", "--help"])
    help_text = capsys.readouterr().out
    assert NAME in help_text and "--toy-compress" in help_text and ROW.about in " ".join(help_text.split())
    with pytest.raises(ConfigError, match="already registered"):
        formats.register(ROW)
    sources = [p for p in Path(edge_spec.__file__).parent.rglob("*.py")]
    assert sources and not [p for p in sources if NAME in p.read_text().lower()]  # no core module names it


def test_an_unregistered_format_is_gone():
    assert NAME not in formats.FORMATS or formats.FORMATS[NAME] is ROW
    with formats.registered(formats.Format("toy2", ("fp32",), kv.BINDING_IO, "toy2-rt", __name__, __name__, "-")):
        assert "toy2-rt" in formats.runtimes()
    assert "toy2" not in formats.FORMATS and "toy2-rt" not in formats.runtimes()


def test_a_row_declares_a_known_attention_form():
    """Every row names the attention form its graphs are traced with; a row naming none of edge_spec.model.forms'
    forms is refused when it registers."""
    from edge_spec.model import forms

    assert {f.attention for f in formats.FORMATS.values()} <= set(forms.NAMES)
    with pytest.raises(ConfigError, match="unknown attention form"):
        formats.register(formats.Format("toy3", ("fp32",), kv.BINDING_IO, "toy3-rt", __name__, __name__, "-",
                                        attention="sideways"))
    assert "toy3" not in formats.FORMATS
