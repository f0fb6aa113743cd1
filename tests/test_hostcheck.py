"""The host check (edge_spec.decoding.hostcheck) and the row modes of Session: probe logic on backends whose kernels are made
to differ on purpose (so the verdicts are known whatever CPU runs the test), windows, cache, verdict, CLI."""

import json

import numpy as np
import pytest

from edge_spec.loading import checkpoints
from edge_spec.decoding import hostcheck
from edge_spec.contract.backend import Session, StepOutput
from edge_spec.cli import main
from edge_spec.contract.layout import kv_layout
from edge_spec.exporters.onnx import export_bundle
from edge_spec.decoding.hostcheck import HostCheck, probe, probe_windows
from edge_spec.contract.kv import CacheSpec, KVLayout
from edge_spec.runtimes.torch import TorchBackend
from tests.test_onnx import tiny_drafter

IDS = [int(i) for i in np.random.default_rng(3).integers(4, 320, 64)]


@pytest.fixture(scope="module")
def loaded(tiny_llama):
    return checkpoints.load(str(tiny_llama[0]))


class Quantized:
    """A backend wrapper that rounds logits to a coarse grid, so every mode is bit-identical on any CPU (eager
    fp32 rows differ by ~1e-7 between T = 1 and T > 1, far below the grid) - plus optional deliberate
    differences: `one_row` perturbs passes of one token, `by_t` perturbs every pass by its length."""

    def __init__(self, backend, one_row: bool = False, by_t: bool = False):
        self.inner, self.one_row, self.by_t = backend, one_row, by_t
        self.layout, self.name, self.identity = backend.layout, "fake", "fake kernels"
        self.calls = []

    @property
    def kernel_s(self):
        return self.inner.kernel_s

    def forward(self, input_ids, position_ids, masks, n_cached, last_only):
        t = input_ids.shape[1]
        self.calls.append(t)
        out = self.inner.forward(input_ids, position_ids, masks, n_cached, last_only)
        logits = np.round(out.logits.astype(np.float64), 2).astype(np.float32)
        if self.one_row and t == 1:
            logits = logits + np.float32(0.25)
        if self.by_t:
            logits = logits + np.float32(0.25 * t)
        return StepOutput(logits, out.hidden)

    def commit(self, plan):
        self.inner.commit(plan)

    def reset(self):
        self.inner.reset()


def fake_session(loaded, **kwargs):
    return Session(Quantized(TorchBackend(loaded.model, kv_layout(loaded.config, 64)), **kwargs))


def test_verdicts_follow_the_kernels(loaded):
    exact = probe(fake_session(loaded), 320, artifact="a", runtime="r", max_t=5)
    assert (exact.min_rows, exact.one_row_max_diff, exact.two_row_max_diff) == (1, 0.0, 0.0)
    one_row = probe(fake_session(loaded, one_row=True), 320, artifact="a", runtime="r", max_t=5)
    assert one_row.min_rows == 2 and one_row.one_row_max_diff == pytest.approx(0.25) and one_row.two_row_max_diff == 0
    broken = probe(fake_session(loaded, by_t=True), 320, artifact="a", runtime="r", max_t=5)
    assert broken.min_rows is None and not broken.exact and "NOT" in broken.summary()
    assert "two-row" in one_row.summary() and "bit for bit" in exact.summary()


def test_two_row_mode_pads_one_token_passes_and_commits_only_the_real_row(loaded):
    """A one-token pass runs as two rows (the dummy: the same token at the next position); only the real row
    comes back and is committed, so the cache and every later logit are those of one-row decoding (up to the
    eager kernels' own ~1e-6 row differences)."""
    one, two = Session(TorchBackend(loaded.model, kv_layout(loaded.config, 64))), fake_session(loaded)
    two.min_rows = 2
    one.prefill(IDS[:10])
    two.prefill(IDS[:10])
    for token in IDS[10:20]:
        a, b = one.forward([token]), two.forward([token])
        assert b.logits.shape == (1, 320) and np.abs(a.logits - b.logits).max() <= 0.01  # the 0.01 grid
        one.commit(1)
        two.commit(1)
    assert one.length == two.length == 20
    assert two.backend.calls[-10:] == [2] * 10  # every decode step ran as two rows
    last = two.forward(IDS[20:23], last_only=True)  # multi-token passes are untouched
    assert two.backend.calls[-1] == 3 and last.logits.shape == (1, 320)
    two.reset()
    two.prefill(IDS[:63])  # the last context slot leaves no room for a dummy: that pass runs as is
    assert two.forward([IDS[0]]).logits.shape == (1, 320) and two.backend.calls[-1] == 1


def test_probe_windows_cross_every_edge_and_leave_room():
    layout = KVLayout((CacheSpec(0, "full", 2, 8, 300, None), CacheSpec(1, "sliding", 2, 8, 20, 12)), 300, 9)
    windows = probe_windows(layout, 9, edge=64)
    assert windows[0] == (2, 2) and {t for _, t in windows} >= {2, 3, 5, 9}
    for (s0, t0), (s1, _) in zip(windows, windows[1:]):
        assert s0 + t0 <= s1  # one pass over the tokens, no overlaps
    for edge in (20, 40, 64, 128):  # ring wraps and bucket edges: some pass straddles each
        assert any(s < edge < s + t for s, t in windows), edge
    assert all(s + t + 1 <= 300 for s, t in windows)
    short = probe_windows(KVLayout((CacheSpec(0, "full", 2, 8, 24, None),), 24, None), 9, edge=64)
    assert short and all(s + t + 1 <= 24 for s, t in short)  # a small context: only what fits


def test_results_are_cached_per_artifact_runtime_and_cpu(loaded, tmp_path):
    session = fake_session(loaded, one_row=True)
    first, cached = hostcheck.checked(session, 320, artifact="a", runtime="r", cache_dir=tmp_path, max_t=5)
    assert not cached and session.min_rows == 2
    session.min_rows = 1
    again, cached = hostcheck.checked(session, 320, artifact="a", runtime="r", cache_dir=tmp_path, max_t=5)
    assert cached and again == first and session.min_rows == 2  # the row mode comes from the cached verdict
    other, cached = hostcheck.checked(session, 320, artifact="a", runtime="r2", cache_dir=tmp_path, max_t=5)
    assert not cached  # another runtime identity (version, provider, threads) is probed again
    path = hostcheck.cache_file("a", "r", tmp_path)
    path.write_text("{not json")
    _, cached = hostcheck.checked(session, 320, artifact="a", runtime="r", cache_dir=tmp_path, max_t=5)
    assert not cached and json.loads(path.read_text())["min_rows"] == 2  # a damaged entry is probed and rewritten
    reread = HostCheck.from_json(json.loads(path.read_text()))
    assert (reread.windows, reread.one_row_max_diff, reread.min_rows) == (first.windows, first.one_row_max_diff, 2)


def test_node_diff_finds_where_the_split_form_parts(loaded, tmp_path, capsys):
    """The node-by-node tool on the negative control: the first node whose step output differs from verify row 0
    lies in attention (the split form sums cache and new keys apart), never in the projections before it."""
    from edge_spec.runtimes.ort_diff import node_diff

    drafter = tiny_drafter(loaded.config)
    split = export_bundle(loaded, tmp_path / "split", drafter=drafter, max_context=96, attention="split")
    report = node_diff(split, start=40, tokens=5, threads=2)
    first = report.first_difference
    assert first is not None and first.op in {"MatMul", "FusedMatMul", "Softmax", "Add", "Where", "Concat", "Mul"}
    assert next(d for d in report.diffs if d.output == "logits").max_diff > 0
    assert "differ" in report.text() and first.output in report.text()
    assert main(["check", "--bundle", str(split), "--nodes", "--threads", "2"]) == 1
    assert first.output in capsys.readouterr().out


def test_cli_check_reports_and_exits_by_verdict(loaded, tmp_path, capsys):
    drafter = tiny_drafter(loaded.config)
    good = export_bundle(loaded, tmp_path / "good", drafter=drafter, precision="int8", max_context=96)
    assert main(["check", "--bundle", str(good), "--threads", "2"]) == 0
    out = capsys.readouterr().out
    assert "verdict:  exact" in out and "cpu:" in out and "onnx int8" in out
    split = export_bundle(loaded, tmp_path / "split", drafter=drafter, precision="int8", max_context=96,
                          attention="split")
    assert main(["check", "--bundle", str(split), "--threads", "2", "--json", str(tmp_path / "c.json")]) == 1
    assert "NOT exact" in capsys.readouterr().out
    assert json.loads((tmp_path / "c.json").read_text())["min_rows"] is None
