"""EAGLE-3 drafters in ONNX bundles (issue 48): the target graph returns the aux states (kv.AUX_HIDDEN), the drafter is
an fc graph + a step graph with its own cache (exporters/onnx_eagle3.py), run by runtimes/ort_eagle3.py.

The exported graphs == the eager Eagle3Drafter; greedy speculative through ORT == plain greedy through ORT and drafts
what the eager runtime drafts (same accepted counts), for two norm options; a manifest whose target lacks aux_hidden
for an eagle3 drafter (or has it without one) is refused; MTP bundles' manifests are unchanged."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from edge_spec.api import load_bundle, load_export_drafter
from edge_spec.contract import kv
from edge_spec.contract.backend import Session
from edge_spec.contract.bundle import eagle3_layout, export_bundle
from edge_spec.contract.layout import kv_layout
from edge_spec.contract.manifest import EAGLE3, MANIFEST, read_manifest
from edge_spec.decoding.sampling import SamplingParams
from edge_spec.decoding.speculative import accept_all, generate_speculative
from edge_spec.errors import BundleError, ConfigError
from edge_spec.loading import checkpoints
from edge_spec.model.eagle3 import chain_mask
from edge_spec.runtimes.ort_eagle3 import OrtEagle3Drafter
from edge_spec.runtimes.torch_eagle3 import eagle3_pair
from tests.test_eagle3_cli import write_eagle3
from tests.test_eagle3_speculative import drafter_for

pytest.importorskip("onnxruntime")

OPTIONS = {  # two of Speculators' norm options per bundle, two exporters
    "norm_before_residual": ({"norm_before_residual": True}, "dynamo"),
    "fc_norm+norm_output": ({"fc_norm": True, "norm_output": True}, "torchscript"),
}
SHARED = "norm_before_residual+target-table"  # the drafter embeds with the target's own table (Speculators' default)


def with_target_table(drafter, target):
    """The drafter with embed_tokens = the target's input embedding (a Speculators checkpoint that leaves it out)."""
    with torch.no_grad():
        drafter.embed_tokens.weight.copy_(target.model.model.embed_tokens.weight)
    return drafter


def table_feeds(folder, m) -> dict:
    """The bundle's shared tables the step graph takes as inputs (none when it keeps a table of its own)."""
    from edge_spec.contract.manifest import read_table

    wanted = {t.name for t in m.graphs["drafter"].io.inputs}
    return {name: np.asarray(read_table(folder, entry)) for name, entry in m.tables.items() if name in wanted}


@pytest.fixture(autouse=True)
def host_check_cache(monkeypatch, tmp_path_factory):
    monkeypatch.setenv("EDGE_SPEC_CACHE", str(tmp_path_factory.getbasetemp() / "eagle3-onnx-cache"))


@pytest.fixture(scope="module")
def target(tiny_llama):
    return checkpoints.load(str(tiny_llama[0]))


@pytest.fixture(scope="module", params=[*OPTIONS, SHARED])
def exported(request, target, tmp_path_factory):
    """(bundle folder, the eager drafter it was exported from)."""
    name = request.param.split("+target-table")[0]
    options, exporter = OPTIONS[name]
    drafter = drafter_for(target, seed=len(name), **options)
    if request.param == SHARED:
        drafter = with_target_table(drafter, target)
    folder = export_bundle(target, tmp_path_factory.mktemp("eagle3-onnx") / "bundle", format="onnx",
                           drafter=drafter, max_context=128, exporter=exporter)
    return folder, drafter


def test_manifest_records_the_eagle3_drafter(exported, target):
    folder, drafter = exported
    m = read_manifest(folder)
    d = m.drafter
    assert d.kind == EAGLE3 and d.aux_layers == [0, 1, 3] and d.draft_vocab_size == 160 and not d.kv_sharing
    assert d.draft_layout == eagle3_layout(drafter.cfg, 128)
    assert kv.aux_size(m.graphs["target"].io) == 3 * target.config.hidden_size
    assert {"drafter", "drafter_fc"} <= set(m.graphs)


def test_exported_graphs_match_the_eager_drafter(exported):
    """fc graph == Eagle3Drafter.fuse; step graph == Eagle3Drafter.forward (last row's logits within 1e-4, the same
    candidate ids, chained hidden, every new K/V row) over a cache and T new rows, T = 4 and 1."""
    from edge_spec.runtimes.ort import make_session

    folder, drafter = exported
    m = read_manifest(folder)
    step = make_session(folder / m.graphs["drafter"].file)
    fc = make_session(folder / m.graphs["drafter_fc"].file)
    rng = np.random.default_rng(0)
    c = drafter.cfg
    for t, s in ((4, 7), (1, 11)):
        aux = rng.standard_normal((1, t, c.num_aux * c.hidden_size)).astype(np.float32)
        ids = rng.integers(0, c.target_vocab_size, (1, t))
        pos = np.arange(s + 1, s + 1 + t)[None]
        mask = chain_mask(s - 2, s, t).numpy()  # two written slots hidden
        caches = [rng.standard_normal((1, 2, s, 16)).astype(np.float32) for _ in range(2)]
        [fused] = fc.run(None, {kv.AUX_HIDDEN: aux})
        names = kv.draft_cache_names(0)
        out = step.run(None, {kv.INPUT_IDS: ids, kv.HIDDEN: fused, kv.POSITION_IDS: pos, kv.DRAFT_MASK: mask,
                              names[0]: caches[0], names[1]: caches[1], **table_feeds(folder, m)})
        with torch.no_grad():
            want_fused = drafter.fuse(torch.from_numpy(aux))
            ref = drafter(want_fused, torch.from_numpy(ids), torch.from_numpy(pos), torch.from_numpy(mask),
                          [torch.from_numpy(caches[0])], [torch.from_numpy(caches[1])])
        assert np.abs(fused - want_fused.numpy()).max() < 1e-4
        assert np.array_equal(out[0], drafter.target_ids(torch.arange(c.draft_vocab_size)).numpy())
        assert np.abs(out[1] - ref.logits[0, -1].numpy()).max() < 1e-4
        assert np.abs(out[2] - ref.hidden[:, -1:].numpy()).max() < 1e-4
        assert np.abs(out[3] - ref.new_k[0].numpy()).max() < 1e-4 and np.abs(out[4] - ref.new_v[0].numpy()).max() < 1e-4


def spec_equals_plain(engine, prompt: list[int], k: int):
    """Greedy speculative at a fixed k == plain greedy (30 tokens, no retrieval), the drafter having drafted;
    returns (the plain result, the speculative run's stats)."""
    plain = engine.generate(prompt, max_new_tokens=30, speculative=False)
    spec = engine.generate(prompt, max_new_tokens=30, speculative=True, allow_inexact=True, lookup=False, spec_k=k,
                           adaptive=False)
    assert spec.tokens == plain.tokens
    stats = spec.extra["spec"]
    assert stats.drafter_calls > 0 and stats.drafted.sum() > 0
    return plain, stats


def test_greedy_speculative_through_ort_equals_plain_and_drafts_as_eager(exported, target):
    folder, drafter = exported
    engine = load_bundle(folder, host_check=False)
    assert isinstance(engine.drafter, OrtEagle3Drafter)
    eager_backend, eager_drafter = eagle3_pair(target.model, drafter, kv_layout(target.config, 128))
    eager = Session(eager_backend)
    for k in (1, 2, 4):
        for seed in range(2):  # a second prompt: the drafter's rows of the first are dropped
            prompt = [int(i) for i in np.random.default_rng(seed + 10 * k).integers(4, 320, 12)]
            plain, stats = spec_equals_plain(engine, prompt, k)
            ref = generate_speculative(eager, eager_drafter, prompt, max_new_tokens=30, params=SamplingParams(),
                                       rng=np.random.default_rng(0), stop_ids=engine.stop_ids, k=k,
                                       vocab_size=target.config.vocab_size, lookup=False, adaptive=False)
            assert ref.tokens == plain.tokens
            assert list(stats.accepted) == list(ref.extra["spec"].accepted)  # the same drafts were accepted


def test_accepted_drafts_are_recomputed_as_eager(exported, target):
    """A verifier that accepts every draft (wrong on purpose): the tokens are the drafts themselves, so ORT and the
    eager runtime agree only if every burst rebuilds the committed rows from the target's states alike."""
    folder, drafter = exported
    engine = load_bundle(folder, host_check=False)
    eager_backend, eager_drafter = eagle3_pair(target.model, drafter, kv_layout(target.config, 128))
    prompt = [int(i) for i in np.random.default_rng(7).integers(4, 320, 9)]
    for k in (2, 4):
        runs = [generate_speculative(session, runner, prompt, max_new_tokens=30, params=SamplingParams(),
                                     rng=np.random.default_rng(0), stop_ids=frozenset(), k=k,
                                     vocab_size=target.config.vocab_size, verifier=accept_all)
                for session, runner in ((engine.session, engine.drafter), (Session(eager_backend), eager_drafter))]
        assert runs[0].tokens == runs[1].tokens and runs[0].extra["spec"].accepted.sum() >= 10


def test_a_long_prompt_runs_in_chunks_and_drafts_as_eager(exported, target):
    """A prompt longer than kv.EAGLE3_FIRST_CHUNK rows: the burst's first step runs the step graph over at most that
    many rows at a time (one pass over a long prompt held [T, T] scores per head), every row written before the next
    chunk reads it, so the drafts are still the eager drafter's, which runs them in one pass (an accept-all verifier:
    the tokens are the drafts)."""
    folder, drafter = exported
    engine = load_bundle(folder, host_check=False)
    rows, step = [], engine.drafter.session

    class Counting:  # the step session, recording the rows of each call
        def run(self, names, feeds):
            rows.append(feeds[kv.INPUT_IDS].shape[1])
            return step.run(names, feeds)

    engine.drafter.session = Counting()
    eager_backend, eager_drafter = eagle3_pair(target.model, drafter, kv_layout(target.config, 128))
    prompt = [int(i) for i in np.random.default_rng(3).integers(4, 320, 2 * kv.EAGLE3_FIRST_CHUNK - 30)]  # 98 tokens
    runs = [generate_speculative(session, runner, prompt, max_new_tokens=20, params=SamplingParams(),
                                 rng=np.random.default_rng(0), stop_ids=frozenset(), k=4,
                                 vocab_size=target.config.vocab_size, verifier=accept_all)
            for session, runner in ((engine.session, engine.drafter), (Session(eager_backend), eager_drafter))]
    assert runs[0].tokens == runs[1].tokens and runs[0].extra["spec"].accepted.sum() >= 10
    assert rows[:2] == [kv.EAGLE3_FIRST_CHUNK, len(prompt) - kv.EAGLE3_FIRST_CHUNK] and max(rows) == kv.EAGLE3_FIRST_CHUNK


def _edit_manifest(folder, tmp_path, edit):
    copy = tmp_path / "edited"
    shutil.copytree(folder, copy)
    raw = json.loads((copy / MANIFEST).read_text())
    edit(raw)
    (copy / MANIFEST).write_text(json.dumps(raw))
    return copy


def test_an_eagle3_bundle_without_aux_hidden_is_refused(exported, tmp_path):
    folder, _ = exported

    def drop_aux(raw):
        outs = raw["graphs"]["target"]["outputs"]
        outs[:] = [o for o in outs if o["name"] != kv.AUX_HIDDEN]

    with pytest.raises(BundleError, match="the target graph has no aux_hidden output") as err:
        read_manifest(_edit_manifest(folder, tmp_path, drop_aux))
    assert "--drafter EAGLE3_FOLDER" in str(err.value)


def test_aux_hidden_without_an_eagle3_drafter_is_refused(exported, tmp_path):
    folder, _ = exported

    def as_mtp(raw):
        raw["drafter"]["kind"] = "mtp"

    with pytest.raises(BundleError, match="aux_hidden of width 192, but the bundle has no eagle3 drafter"):
        read_manifest(_edit_manifest(folder, tmp_path, as_mtp))

    def unknown(raw):
        raw["drafter"]["kind"] = "medusa"

    with pytest.raises(BundleError, match="drafter kind 'medusa'"):
        read_manifest(_edit_manifest(folder, tmp_path / "u", unknown))


def test_a_speculators_folder_exports_and_its_bundle_runs_on_both_runtimes(tiny_llama, target, tmp_path):
    """load_export_drafter reads the folder (no embed_tokens: the target's); the bundle records it as the source, so
    the torch runtime rebuilds it (content hash checked) and drafts the same tokens."""
    source = write_eagle3(tmp_path / "drafter")
    drafter = load_export_drafter(source, target)
    folder = export_bundle(target, tmp_path / "bundle", format="onnx", drafter=drafter, drafter_source=str(source),
                           max_context=64, exporter="torchscript")
    prompt = [5, 9, 17, 33, 2, 8]
    runs = []
    for runtime in ("ort", "torch"):
        engine = load_bundle(folder, runtime=runtime, host_check=False)
        out = engine.generate(prompt, max_new_tokens=16, speculative=True, allow_inexact=True, lookup=False,
                              spec_k=3, adaptive=False)
        assert out.tokens == engine.generate(prompt, max_new_tokens=16, speculative=False).tokens
        runs.append((out.tokens, list(out.extra["spec"].accepted)))
    assert runs[0] == runs[1]


def _vocab_tables(path, vocab: int, hidden: int = 64) -> list[str]:
    """A graph file's float32 [V, H] initializers (a vocabulary-sized table stored in it)."""
    import onnx

    proto = onnx.load(str(path), load_external_data=False)
    return [i.name for i in proto.graph.initializer if i.data_type == onnx.TensorProto.FLOAT
            and tuple(i.dims) == (vocab, hidden)]


def test_the_drafter_gathers_the_bundles_one_table(exported, target):
    """A drafter whose embed_tokens is the target's takes the bundle's shared table as inputs and stores no
    vocabulary-sized table; one with a table of its own keeps it (float32 in an fp32 bundle)."""
    folder, drafter = exported
    m = read_manifest(folder)
    shared = torch.equal(drafter.embed_tokens.weight, target.model.model.embed_tokens.weight)
    inputs = [t.name for t in m.graphs["drafter"].io.inputs]
    assert (kv.EMBED_TABLE in inputs) == shared
    assert bool(_vocab_tables(folder / m.graphs["drafter"].file, target.config.vocab_size)) == (not shared)


@pytest.mark.parametrize("precision", ["int8", "int4"])
@pytest.mark.parametrize("table", ["target", "own"])
def test_quantized_bundles_store_no_float_vocabulary_table(target, tmp_path, precision, table):
    """int8 / int4: the drafter gathers the tied head's quantized bytes (the target's table) or its own table on the
    head's grid; no float32 [V, H] array is written in either; greedy speculative == plain through ORT."""
    drafter = drafter_for(target, seed=3, norm_before_residual=True)
    if table == "target":
        drafter = with_target_table(drafter, target)
    folder = export_bundle(target, tmp_path / "bundle", format="onnx", drafter=drafter, max_context=64,
                           exporter="torchscript", precision=precision)
    m = read_manifest(folder)
    vocab = target.config.vocab_size
    inputs = {t.name for t in m.graphs["drafter"].io.inputs}
    bits = kv.table_bits(m.tables)
    assert bits == {"int8": 8, "int4": 4}[precision] and kv.EMBED_TABLE not in m.tables
    assert ({t.name for t in kv.table_specs(vocab, target.config.hidden_size, bits)} <= inputs) == (table == "target")
    for graph in ("target", "drafter", "drafter_fc"):
        assert not _vocab_tables(folder / m.graphs[graph].file, vocab), graph
    engine = load_bundle(folder, host_check=False)
    prompt = [int(i) for i in np.random.default_rng(5).integers(4, 320, 10)]
    plain = engine.generate(prompt, max_new_tokens=24, speculative=False)
    spec = engine.generate(prompt, max_new_tokens=24, speculative=True, allow_inexact=True, lookup=False, spec_k=3,
                           adaptive=False)
    assert spec.tokens == plain.tokens and spec.extra["spec"].drafted.sum() > 0


def test_other_formats_refuse_an_eagle3_drafter(target, tmp_path):
    """Every shipped format exports eagle3 drafters since 2026-12-07 (QNN last); a registered format outside
    EAGLE3_FORMATS (the toy format of tests/test_toy_format.py) is refused by name, before any work."""
    from edge_spec.contract import formats
    from tests.test_toy_format import ROW

    with formats.registered(ROW), pytest.raises(ConfigError, match="onnx, executorch, coreml, qnn bundles only so far"):
        export_bundle(target, tmp_path / "b", format=ROW.name, drafter=drafter_for(target), max_context=64)
    assert not (tmp_path / "b").exists()


def test_mtp_bundles_are_unchanged(tiny_bundles):
    folder, _, _ = tiny_bundles.get("onnx", "llama")
    raw = json.loads((folder / MANIFEST).read_text())
    assert not {"kind", "aux_layers", "draft_vocab_size", "draft_kv"} & set(raw["drafter"])
    assert kv.AUX_HIDDEN not in [o["name"] for o in raw["graphs"]["target"]["outputs"]]
    m = read_manifest(folder)
    assert m.drafter.kind == "mtp" and "drafter_fc" not in m.graphs


def test_the_memory_check_counts_the_drafters_own_cache(exported):
    from edge_spec.contract.manifest_check import check_memory, kv_cache_bytes

    folder, _ = exported
    manifest = read_manifest(folder)
    draft = manifest.drafter.draft_layout
    target_only = kv_cache_bytes(manifest.layout)
    assert check_memory(manifest.layout, folder, available=target_only, drafter=None) == target_only
    with pytest.raises(BundleError, match="the drafter's own included"):
        check_memory(manifest.layout, folder, available=target_only, drafter=draft)
    total = target_only + kv_cache_bytes(draft)
    assert check_memory(manifest.layout, folder, available=total, drafter=draft) == total
