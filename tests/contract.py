"""The contract every format's bundles keep, as data: the rows (format x model family x KV binding) that run on this
machine, the one factory that exports each tiny bundle once per session (per xdist worker), and the helpers the
claims are measured with. tests/test_contract.py states the claims over the rows; the per-format test files keep
what only their format has, and build their fixtures from the same factory.

A row carries what its format's tests measured before the suite existed: tolerances, windows, token counts, the
runtime options exactness holds under. Nothing here is looser than those tests were.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from edge_spec.api import load_bundle
from edge_spec.contract import formats, kv
from edge_spec.contract.backend import DraftStep
from edge_spec.contract.manifest import MANIFEST, sha256_file
from edge_spec.model.drafter import new_drafter
from tests.parity import LOGITS_TOL

COREML_EXECUTOR = ("EDGE_SPEC_COREML_EXECUTOR", "mil")  # Core ML packages run here on the MIL reference executor
# Core ML --kv state: fp16 states vs eager with fp16-rounded keys / values, max abs: the two round some of the same
# fp32 values (1 ulp apart) to neighbouring fp16 ones; measured 6.9e-4 on the tiny Gemma-4 (tests/test_coreml.py)
STATE_REF_TOL = 2e-3


def tiny_drafter(cfg, **kwargs):
    """The tests' tiny drafter for `cfg` (seeded, so every format exports the same one)."""
    args = dict(hidden_size=32, num_layers=2, intermediate_size=64, num_centroids=16, top_k_clusters=4)
    return new_drafter(cfg, seed=7, **{**args, **kwargs})


# ---- the rows ---------------------------------------------------------------------------------------------------
# family -> its drafter: llama's and qwen3's clustered heads score with the target's (tied) table, gemma's is dense
# with its own
DRAFTERS = {"llama": dict(head_from="target"), "gemma": dict(clustered=False), "qwen3": dict(head_from="target")}
# passes of <= 9 tokens: gemma's rings of 6 + 9 - 1 = 14 slots (`state`: 15), so the tests wrap them many times
SHAPES = {"llama": dict(max_context=160), "gemma": dict(max_context=96, max_pass=9), "qwen3": dict(max_context=160)}
# qwen3 (llama blocks + per-head q/k norms, head_dim != hidden / heads) runs every claim in one row per format and
# KV binding that takes it, not in every binding: each row exports its bundles (QNN: its llama and gemma rows)
QWEN3_ROWS = {("onnx", kv.BINDING_IO), ("onnx", kv.BINDING_SHARED), ("executorch", kv.BINDING_STATE),
              ("coreml", kv.BINDING_IO), ("qnn", kv.BINDING_IO)}
FIXED = dict(max_draft_len=4, max_pass=9)  # fixed-shape formats: target graphs of 1, 2, 3, 5 and 9 tokens
WINDOWS = ((58, 6), (61, 5), (40, 2), (64, 4), (26, 9))  # (start, T): verify passes across bucket edges, ring wraps


@dataclass(frozen=True)
class Row:
    """One (format, family, binding): how its tiny bundle is exported and what its tests measure it with."""

    format: str
    family: str  # "llama" | "gemma" | "qwen3" (tests/conftest.py's tiny checkpoints)
    binding: str
    group: str  # the xdist group of the per-format file that builds the same bundles (one bundle, one worker)
    export: dict = field(default_factory=dict)  # export_bundle options (precision, lengths, context)
    tol: float | None = LOGITS_TOL  # target and drafter vs eager, max abs; None: no eager parity at a fixed tol
    fp16_kv: bool = False  # eager reference with fp16-rounded keys / values (Core ML's fp16 states)
    drafter: bool = True  # the bundle carries a drafter (the toy format drafts with its target)
    threads: int | None = None
    env: tuple = ()  # (name, value) environment its runtime needs here
    runs: tuple = (("", {}),)  # (id, runtime options) speculative == plain is claimed under
    exact_run: dict = field(default_factory=dict)  # the runtime options verify rows / rejections are measured under
    verify: tuple = (90, WINDOWS)  # (prompt length, windows) of the verify-rows test
    spec_tokens: int = 30  # new tokens of speculative == plain
    reject_tokens: int = 60  # new tokens of the rejected-drafts test (gemma rows)
    damage: str = ""  # the file the damaged-bundle test damages
    unreadable: str | None = None  # regex of the runtime's refusal of that file once its checksums are re-recorded
    drafter_kind: str = "mtp"  # "eagle3": a tiny random Speculators EAGLE-3 drafter (tests/test_eagle3_speculative.py)
    long: bool = False  # a variant of a format whose default rows the fast tier runs: the long tier's (tests/tiers.py)

    @property
    def id(self) -> str:
        return f"{self.format}-{self.family}-{self.binding}" + ("-eagle3" if self.drafter_kind == "eagle3" else "")

    @property
    def key(self) -> tuple:
        return self.format, self.family, self.export.get("precision"), self.binding, self.drafter_kind


def _rows() -> list[Row]:
    rows = []
    for family in ("llama", "gemma", "qwen3"):
        shape = SHAPES[family]
        onnx_windows = ((70, WINDOWS[:4]) if family != "gemma" else
                        (80, ((58, 6), (53, 6), (40, 2), (64, 4), (26, 9))))
        rows.append(Row("onnx", family, kv.BINDING_IO, "test_onnx.py",
                        export=dict(precision="fp32", binding=kv.BINDING_IO, **shape),
                        verify=onnx_windows, spec_tokens=40, damage="onnx/target.onnx",
                        unreadable=r"target\.onnx: onnxruntime .*cannot load this graph"))
        if family != "gemma":  # GroupQueryAttention writing the caches in place (full-attention llama-like models)
            rows.append(Row("onnx", family, kv.BINDING_SHARED, "test_onnx.py",
                            export=dict(precision="fp32", binding=kv.BINDING_SHARED, **shape), verify=onnx_windows,
                            spec_tokens=40, damage="onnx/target.onnx",
                            unreadable=r"target\.onnx: onnxruntime .*cannot load this graph"))
        # qwen3's .pte is read by no native test: its own group, so it is not queued behind the native builds
        group = "tiny-pte" if family != "qwen3" else "tiny-pte-qwen3"
        rows.append(Row("executorch", family, kv.BINDING_STATE, group, export=dict(precision="fp32", **shape),
                        threads=2, spec_tokens=40, reject_tokens=70,
                        verify=(130, WINDOWS if family == "gemma" else WINDOWS[:4] + ((120, 9),)),
                        damage="executorch/program.pte",
                        unreadable=r"program\.pte: executorch cannot load this program"))
        for binding in (kv.BINDING_IO, kv.BINDING_STATE):
            rows.append(Row("coreml", family, binding, "test_coreml.py",
                            export=dict(precision="fp32", max_context=shape["max_context"], **FIXED, binding=binding),
                            tol=LOGITS_TOL if binding == kv.BINDING_IO else STATE_REF_TOL,
                            fp16_kv=binding == kv.BINDING_STATE, env=(COREML_EXECUTOR,),
                            damage="coreml/program.mlpackage/Data/com.apple.CoreML/model.mlmodel",
                            unreadable=r"program\.mlpackage: coremltools cannot read this package"))
        # QNN: 16a8w, so no parity at an fp32 tolerance (its bounds vs eager: tests/test_qnn.py). The default two
        # target graphs: 5 rows (decode steps and verify passes, padded) and 9 (the prefill chunk; the (30, 9)
        # window: a 9-row pass gives the bits of padded 5-row steps since ranges are merged by node position).
        # Exact on the simulated HTP (the default provider: the host check's probe there finds verify rows ==
        # decode steps since `model.masked_values` and `qnn_calibration.cache_groups`, docs/android-qnn.md) and
        # through the same QDQ graphs on the CPU provider, where the verify-rows test measures its windows
        rows.append(Row("qnn", family, kv.BINDING_IO, "test_qnn.py",
                        export=dict(precision="16a8w", max_context=64 if family == "llama" else 48, **FIXED), tol=None,
                        runs=(("htp", {}), ("cpu", {"provider": "cpu"})), exact_run={"provider": "cpu"},
                        threads=2, spec_tokens=20, reject_tokens=30,
                        verify=(45, ((20, 5), (30, 9), (41, 3) if family == "llama" else (12, 3))),
                        damage="qnn/target_5.ctx.onnx", unreadable=r"target_5\.ctx\.onnx: onnxruntime cannot load it"))
    rows = [r for r in rows if r.family != "qwen3" or (r.format, r.binding) in QWEN3_ROWS]
    # the long tier's rows (tests/tiers.py): qwen3 beyond ONNX, and Core ML's gemma `state` row. Each is a variant of
    # a row the fast tier runs (qwen3: the llama rows' blocks + q/k norms, which the ONNX rows and the QNN row keep in
    # the fast tier; coreml-gemma-state: the llama `state` row's binding, the gemma `io` row's model)
    rows = [replace(r, long=True) if (r.family == "qwen3" and r.format in ("executorch", "coreml"))
            or (r.format, r.family, r.binding) == ("coreml", "gemma", kv.BINDING_STATE) else r for r in rows]
    # an EAGLE-3 drafter in every format (issue 48): each format's default llama row again, the drafter swapped, in a
    # group of its own (no per-format file reads these bundles). The other bindings' eagle3 bundles are their files'
    # (tests/test_native_eagle3.py: onnx `shared`; tests/test_eagle3_coreml.py: coreml `state`)
    # (the ExecuTorch and Core ML ones in the long tier: tests/test_eagle3_executorch.py and tests/test_eagle3_coreml.py
    # export those formats' EAGLE-3 bundles in the fast tier)
    defaults = {(f.name, f.binding) for f in formats.FORMATS.values()}
    rows += [replace(r, drafter_kind="eagle3", group=f"contract-eagle3-{r.format}",
                     long=r.format in ("executorch", "coreml")) for r in rows
             if r.family == "llama" and r.format != "toy" and (r.format, r.binding) in defaults]
    # the toy format (tests/test_toy_format.py, registered at run time): full-attention llama, no drafter of its own
    rows.append(Row("toy", "llama", kv.BINDING_IO, "test_toy_format.py", export=dict(precision="fp32", max_context=160),
                    drafter=False, spec_tokens=16,
                    damage="toy/weights.npz"))
    return rows


ROWS = _rows()


# ---- the factory ------------------------------------------------------------------------------------------------
class BundleFactory:
    """(folder, target, drafter) per Row.key, exported on first use and kept for the session (of one xdist worker:
    tests sharing a bundle share an xdist group). `checkpoints`: family -> tiny checkpoint folder."""

    def __init__(self, tmp_path_factory, checkpoints: dict[str, Path]):
        self.tmp, self.checkpoints, self.built = tmp_path_factory, checkpoints, {}

    def __call__(self, row: Row):
        if row.key not in self.built:
            self.built[row.key] = self._export(row)
        return self.built[row.key]

    def row(self, fmt: str, family: str, binding: str | None = None, drafter_kind: str = "mtp") -> Row:
        return next(r for r in ROWS if (r.format, r.family, r.drafter_kind) == (fmt, family, drafter_kind)
                    and binding in (None, r.binding))

    def get(self, fmt: str, family: str, binding: str | None = None):
        return self(self.row(fmt, family, binding))

    def _export(self, row: Row):
        import time

        from edge_spec.contract.bundle import export_bundle
        from edge_spec.loading import checkpoints

        from edge_spec.model.drafter import save_drafter

        target = checkpoints.load(str(self.checkpoints[row.family]))
        folder, drafter, source = self.tmp.mktemp(row.format), None, None
        if row.drafter and row.drafter_kind == "eagle3":
            from edge_spec.loading.speculators_eagle3 import save_eagle3
            from tests.test_eagle3_speculative import drafter_for

            drafter = drafter_for(target, seed=5, norm_before_residual=True)
            source = str(save_eagle3(drafter, folder / "drafter", with_embedding=True))  # `--runtime torch` reads it
        elif row.drafter:
            drafter = tiny_drafter(target.config, **DRAFTERS[row.family])
            # saved, so that the eager runtime can rebuild the bundle's pair (`--runtime torch`)
            source = str(save_drafter(drafter, folder / "drafter"))
        start = time.perf_counter()
        out = export_bundle(target, folder / row.id, format=row.format, drafter=drafter, drafter_source=source,
                            **row.export)
        print(f"\ntiny bundle {row.id}: exported in {time.perf_counter() - start:.0f} s")
        return out, target, drafter


# ---- what the claims are measured with ----------------------------------------------------------------------------
def host_checked_session(folder, threads=2, **options):
    """The bundle's session in the row mode this host's check picks (probed afresh, not from a cache)."""
    engine = load_bundle(folder, threads=threads, host_check=False, **options)
    check = engine.check_host(cache=False)
    assert check.exact, f"this host does not keep the bundle batch-invariant in any row mode:\n{check.report()}"
    return engine.session


def differing_windows(session, ids, windows) -> list[tuple[int, int]]:
    """(start, T) windows where a T-token verify pass differs (in any bit) from T one-token decode steps over the
    same tokens, run in the session's row mode (`Session.min_rows`)."""
    bad = []
    for start, t in windows:
        session.reset()
        session.prefill(ids[:start])
        steps = []
        for token in ids[start:start + t]:  # plain decoding: one token per forward
            steps.append(session.forward([token]).logits[0])
            session.commit(1)
        session.rewind(start)  # (gemma: a 14-slot ring still holds every key a query at `start` sees)
        verify = session.forward(ids[start:start + t]).logits  # one verify pass over the same tokens
        if not np.array_equal(np.stack(steps), verify):
            bad.append((start, t))
    return bad


class OracleDrafter:
    """Proposes the known greedy continuation, wrong where `wrong(position)` says: always right, always wrong,
    every third wrong, or at random - accepted bursts, rejected ones, rewrites of rejected slots."""

    def __init__(self, continuation, prompt_len, wrong):
        self.continuation, self.prompt_len, self.wrong = continuation, prompt_len, wrong

    def begin(self, position, masks, n_cached):
        self.position, self.offset = position, 0

    def step(self, token, hidden):
        self.offset += 1
        pos = self.position + self.offset
        i = pos - self.prompt_len
        tok = self.continuation[i] if 0 <= i < len(self.continuation) else 4
        if self.wrong(pos):
            tok = 4 + (tok + 1) % 300
        return DraftStep(np.array([tok]), np.array([1.0], dtype=np.float32), hidden)


def rehash(folder, rel):
    """Re-record `rel`'s checksum in the manifest: only the runtime can tell the file is damaged now."""
    raw = json.loads((folder / MANIFEST).read_text())
    path = folder / rel
    raw["files"][rel] = {"sha256": sha256_file(path), "bytes": path.stat().st_size}
    (folder / MANIFEST).write_text(json.dumps(raw))


def copy_bundle(folder, dst):
    shutil.copytree(folder, dst)
    return dst


def round_kv_to_fp16(monkeypatch):
    """Eager attention with every new key and value rounded to fp16 before it is used or cached, as Core ML's states
    hold them: the reference a `--kv state` package matches to STATE_REF_TOL."""
    from edge_spec.model.forms import Pass

    attend = Pass.attend

    def rounded(self, layer, i, q, k, v, *rest):
        return attend(self, layer, i, q, *(None if x is None else x.half().to(x.dtype) for x in (k, v)), *rest)

    monkeypatch.setattr(Pass, "attend", rounded)
