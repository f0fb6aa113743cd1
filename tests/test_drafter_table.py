"""A drafter whose token table is derived from its target's embedding (config.json edge_spec.table_from = "target"):
table [V, Ha] = target embedding [V, Ht] @ P^T with a learned P [Ha, Ht]; the checkpoint stores P, not the table."""

import json

import numpy as np
import pytest
import torch
from safetensors import safe_open

import edge_spec
from edge_spec.contract.backend import Session
from edge_spec.decoding.generate import generate_plain
from edge_spec.decoding.sampling import SamplingParams
from edge_spec.decoding.speculative import generate_speculative
from edge_spec.errors import CheckpointError
from edge_spec.loading import checkpoints
from edge_spec.contract.layout import kv_layout
from edge_spec.loading.checkpoints import load_drafter
from edge_spec.model.drafter import drafter_config_from_dict, new_drafter, pair, save_drafter
from edge_spec.runtimes.torch import TorchBackend, TorchDrafter
from tests.parity import assert_drafter_matches_eager, prompt_ids

ARGS = dict(hidden_size=32, num_layers=2, intermediate_size=64, num_centroids=16, top_k_clusters=4)


@pytest.fixture(scope="module")
def target(tiny_llama):
    return checkpoints.load(str(tiny_llama[0]))


def derived(target, seed=5, **kwargs):
    return new_drafter(target.config, seed=seed, **{**ARGS, "table_from": "target", **kwargs})


def burst_inputs(target, drafter, n=9):
    """A prefill through the eager target, then the inputs of one draft step (as TorchDrafter builds them)."""
    backend = TorchBackend(target.model, kv_layout(target.config, 64))
    session = Session(backend)
    out = session.prefill(prompt_ids(n, seed=2))
    return backend, session, int(out.logits[-1].argmax()), out.hidden[-1]


def draft_steps(target, drafter, steps=3):
    backend, session, token, hidden = burst_inputs(target, drafter)
    runner = TorchDrafter(drafter, backend, pair(target.model, drafter))
    runner.begin(session.length, session.state.drafter_masks(), session.length)
    out = []
    for _ in range(steps):
        step = runner.step(token, hidden)
        out.append(step)
        token, hidden = int(step.token_ids[np.argmax(step.logits)]), step.hidden
    return out


def test_config_and_checkpoint_hold_the_projection_not_the_table(target, tmp_path):
    drafter = derived(target)
    assert drafter.cfg.table_from == "target" and drafter.cfg.head_from == "drafter"
    assert drafter.table_projection.weight.shape == (ARGS["hidden_size"], target.config.hidden_size)  # P [Ha, Ht]
    assert not hasattr(drafter.model, "embed_tokens") and not hasattr(drafter, "lm_head")
    folder = save_drafter(drafter, tmp_path / "d")
    raw = json.loads((folder / "config.json").read_text())
    assert raw["edge_spec"]["table_from"] == "target"
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert "table_projection.weight" in keys and "bound_table" not in keys
    assert not any(k.endswith("embed_tokens.weight") or k == "lm_head.weight" for k in keys)
    # own-table configs are unchanged: no table_from key, and they load as "own"
    own = new_drafter(target.config, **ARGS)
    assert "table_from" not in own.cfg.raw["edge_spec"] and own.cfg.table_from == "own"
    bad = {**raw, "edge_spec": {**raw["edge_spec"], "head_from": "target"}}
    with pytest.raises(CheckpointError, match="needs head_from 'drafter'"):
        drafter_config_from_dict(bad)
    with pytest.raises(CheckpointError, match="'own' or 'target'"):
        drafter_config_from_dict({**raw, "edge_spec": {**raw["edge_spec"], "table_from": "file"}})


def test_save_load_round_trip_without_the_table(target, tmp_path):
    drafter = derived(target)
    ref = draft_steps(target, drafter)
    loaded = load_drafter(save_drafter(drafter, tmp_path / "d"))
    assert not loaded.bound
    got = draft_steps(target, loaded)  # pair() binds it
    for a, b in zip(ref, got):
        assert np.array_equal(a.token_ids, b.token_ids) and np.array_equal(a.logits, b.logits)
        assert np.array_equal(a.hidden, b.hidden)
    assert torch.equal(loaded.table, target.model.model.embed_tokens.weight @ loaded.table_projection.weight.T)
    # bf16 storage (what keeps the gemma3-270m drafter under 25 MB): P comes back rounded, as float32
    small = load_drafter(save_drafter(drafter, tmp_path / "bf16", dtype=torch.bfloat16))
    p = drafter.table_projection.weight
    assert small.table_projection.weight.dtype == torch.float32
    assert torch.equal(small.table_projection.weight, p.to(torch.bfloat16).float())
    assert (tmp_path / "bf16" / "model.safetensors").stat().st_size < (tmp_path / "d" / "model.safetensors").stat().st_size


def test_unbound_use_is_refused_with_the_fix(target, tmp_path):
    drafter = load_drafter(save_drafter(derived(target), tmp_path / "d"))
    with pytest.raises(CheckpointError, match=r"not paired with a target[\s\S]*bind_target"):
        _ = drafter.table
    backend, session, token, hidden = burst_inputs(target, drafter)
    runner = TorchDrafter(drafter, backend, {"full": target.config.num_layers - 1})  # sources only, no binding
    runner.begin(session.length, session.state.drafter_masks(), session.length)
    with pytest.raises(CheckpointError, match="bind_target"):
        runner.step(token, hidden)
    with pytest.raises(CheckpointError, match="bind_target"):
        drafter.table_rows(torch.tensor([1, 2]))
    with pytest.raises(CheckpointError, match="shape"):
        drafter.bind_target(torch.zeros(target.config.vocab_size, target.config.hidden_size + 1))


def test_bound_drafter_equals_an_own_table_drafter_given_the_same_table(target):
    drafter = derived(target)
    pair(target.model, drafter)
    own = new_drafter(target.config, seed=9, **ARGS)  # same shape, its own table
    state = {k: v for k, v in drafter.state_dict().items() if k != "table_projection.weight"}
    state["model.embed_tokens.weight"] = drafter.table.detach().clone()
    assert not own.load_state_dict(state, strict=False).unexpected_keys  # lm_head.weight is the tied table
    assert own.lm_head.weight is own.model.embed_tokens.weight  # still tied
    for a, b in zip(draft_steps(target, drafter), draft_steps(target, own)):
        assert np.array_equal(a.token_ids, b.token_ids)
        assert np.array_equal(a.logits, b.logits) and np.array_equal(a.hidden, b.hidden)


def test_table_follows_the_projection(target):
    """A bound table is re-made when P changes (training, load_state_dict) - never a stale table."""
    drafter = derived(target)
    pair(target.model, drafter)
    before = drafter.table.clone()
    with torch.no_grad():
        drafter.table_projection.weight.mul_(2.0)
    assert torch.allclose(drafter.table, 2.0 * before)


def test_onnx_export_round_trip(target, tmp_path):
    """The exporter pairs (binds) the drafter itself; the graph holds the table as an ordinary constant: ORT drafter
    steps == eager, greedy speculative == plain through the ort runtime, and the eager runtime of the bundle agrees."""
    import onnx

    from edge_spec.api import load_bundle
    from edge_spec.contract.manifest import read_manifest
    from edge_spec.exporters.onnx import export_bundle

    src = save_drafter(derived(target), tmp_path / "d")
    drafter = load_drafter(src)  # unbound: export_bundle must bind it
    folder = export_bundle(target, tmp_path / "b", drafter=drafter, drafter_source=str(src), max_context=96)
    manifest = read_manifest(folder)
    assert manifest.drafter.head_from == "drafter" and manifest.drafter.config["edge_spec"]["table_from"] == "target"
    graph = onnx.load(str(next(folder.rglob("drafter*.onnx"))), load_external_data=False)
    shapes = [tuple(t.dims) for t in graph.graph.initializer]
    assert (target.config.vocab_size, ARGS["hidden_size"]) in shapes  # the materialized table
    assert_drafter_matches_eager(folder, target, drafter)
    engine = load_bundle(folder, threads=1)
    ids = prompt_ids(11, seed=4)
    session = Session(engine.session.backend)
    greedy = SamplingParams()
    plain = generate_plain(session, ids, max_new_tokens=32, params=greedy, rng=np.random.default_rng(0),
                           stop_ids=frozenset()).tokens
    for k in (1, 4):
        spec = generate_speculative(session, engine.drafter, ids, max_new_tokens=32, params=greedy,
                                    rng=np.random.default_rng(0), stop_ids=frozenset(), k=k,
                                    vocab_size=engine.vocab_size)
        assert spec.tokens == plain
    eager = edge_spec.load(bundle=folder, runtime="torch", host_check=False)  # reloads + binds the checkpoint pair
    assert eager.drafter.drafter.bound
    assert eager.generate(ids, max_new_tokens=32, lookup=False, allow_inexact=True, adaptive=False).tokens == plain


def test_training_moves_the_projection_and_not_the_target_embedding(target):
    """mtp_loss through the derived table: the loss falls over a few steps on one batch, P moves, the target's
    embedding does not (it gets no gradient), and the bound table follows the trained P."""
    from edge_spec.train.optim import make_optimizer
    from edge_spec.train.teacher import extract
    from edge_spec.train.trainer import TrainConfig, mtp_loss

    torch.manual_seed(0)
    drafter = derived(target, clustered=True)
    sources = pair(target.model, drafter)
    seqs = np.random.default_rng(0).integers(4, target.config.vocab_size, (2, 24)).astype(np.int32)
    shard = extract(target.model, seqs, sorted(set(sources.values())), dtype=torch.float32)
    tokens = torch.from_numpy(seqs.astype(np.int64))
    hidden = torch.from_numpy(shard["hidden"].astype(np.float32)) * 30.0  # a sharp teacher law (a random one is flat)
    kv = {kind: (torch.from_numpy(shard[f"k_{l}"].astype(np.float32)),
                 torch.from_numpy(shard[f"v_{l}"].astype(np.float32))) for kind, l in sources.items()}
    embed_param = target.model.model.embed_tokens.weight
    embed, table = embed_param.detach().float(), target.model.lm_head.weight.detach().float()
    order = drafter.masked_embedding.token_ordering
    cluster_of = torch.empty_like(order)
    cluster_of[order] = torch.arange(drafter.cfg.num_centroids).repeat_interleave(
        drafter.cfg.vocab_size // drafter.cfg.num_centroids)
    cfg = TrainConfig(steps_ahead=2, vocab_sample=64)
    embed_before, p_before = embed_param.detach().clone(), drafter.table_projection.weight.detach().clone()
    drafter.train().requires_grad_(True)
    opt = make_optimizer(drafter, "adamw", 2e-2)
    losses = []
    for step in range(20):
        loss, _ = mtp_loss(drafter, tokens, hidden, kv, embed, table, cluster_of, cfg, with_metrics=False)
        opt.zero_grad()
        loss.backward()
        if step == 0:
            assert drafter.table_projection.weight.grad is not None
            assert drafter.table_projection.weight.grad.abs().sum() > 0
            assert embed_param.grad is None
        opt.step()
        losses.append(float(loss.detach()))
    drafter.eval()
    assert np.mean(losses[-3:]) < 0.7 * np.mean(losses[:3]), losses
    assert not torch.equal(drafter.table_projection.weight, p_before)
    assert torch.equal(embed_param.detach(), embed_before)
    with torch.no_grad():
        expect = embed_param @ drafter.table_projection.weight.T
    assert torch.equal(drafter.table, expect)


def test_gemma3_270m_sizes_computed_from_its_shape():
    """The E2B-assistant-shaped drafter of gemma3-270m (hidden 256, 4 layers, 4 heads, MLP 2048, 2048 clusters,
    top 32): the graph holds ~77M parameters either way; with the table derived from the target only ~9.6M are
    stored, 21.2 MB in bf16 (<= 25 MB). Shapes only: nothing is loaded or allocated."""
    from edge_spec.loading.gguf_gemma3 import SLIDING_PATTERN
    from edge_spec.model.drafter_sizes import BUDGET_BYTES, GEMMA3_270M, e2b_sizes_for_gemma3_270m

    assert GEMMA3_270M["layer_types"] == ["sliding_attention" if (i + 1) % SLIDING_PATTERN else "full_attention"
                                          for i in range(18)]
    sizes = e2b_sizes_for_gemma3_270m()
    own, tgt = sizes["own"], sizes["target"]
    v, ha, ht = 262144, 256, 640
    assert own["table_parameters"] == tgt["table_parameters"] == v * ha
    assert own["graph_parameters"] == own["stored_parameters"]
    assert tgt["graph_parameters"] == own["graph_parameters"] + ha * ht  # + P
    assert tgt["stored_parameters"] == own["stored_parameters"] - v * ha + ha * ht
    assert 75e6 < tgt["graph_parameters"] < 80e6
    assert tgt["stored_bytes"]["bfloat16"] <= BUDGET_BYTES < tgt["stored_bytes"]["float32"]
    assert own["stored_bytes"]["bfloat16"] > 6 * BUDGET_BYTES
    assert tgt["stored_integer_bytes"] == v * 8  # token_ordering, int64


def test_train_drafter_pipeline_with_a_derived_table(tiny_llama, tmp_path):
    """`train-drafter --head-from drafter --table-from target --save-dtype bfloat16` end to end on a tiny target:
    the pipeline pairs the drafter (binds the table), trains P, writes P in bf16 and no table."""
    from edge_spec.train.pipeline import run
    from edge_spec.train.trainer import TrainConfig

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    rng = np.random.default_rng(0)
    for i in range(12):
        (corpus / f"doc_{i}.txt").write_text(" ".join(f"w{int(s) + j}" for s in rng.integers(4, 200, 30)
                                                      for j in range(6)))
    loaded = checkpoints.load(str(tiny_llama[0]))
    out = tmp_path / "drafter"
    report = run(loaded, out, data=[str(corpus)], max_tokens=12 * 180, hidden_size=32, num_layers=1,
                 intermediate_size=64, num_centroids=16, top_k_clusters=4, head_from="drafter", table_from="target",
                 train_cfg=TrainConfig(batch_seqs=2, warmup=2), max_steps=4, save_dtype=torch.bfloat16)
    assert report["steps"] == 4 and report["drafter"]["table_from"] == "target"
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert f.get_tensor("table_projection.weight").dtype == torch.bfloat16
        assert not any("embed_tokens" in k for k in f.keys())  # noqa: SIM118 (safe_open is not a dict)
    drafter = load_drafter(out)
    fresh = new_drafter(loaded.config, hidden_size=32, num_layers=1, intermediate_size=64, num_centroids=16,
                        top_k_clusters=4, head_from="drafter", table_from="target")  # the pipeline's initial drafter
    assert not torch.equal(drafter.table_projection.weight, fresh.table_projection.weight.to(torch.bfloat16).float())
    pair(loaded.model, drafter)
    assert drafter.table.shape == (loaded.config.vocab_size, 32)


def test_the_shipped_gemma3_drafters_are_under_the_commit_budget_and_builtin_picks_per_format():
    """edge_spec/assets/drafters/gemma3-270m (docs/drafter.md): the EAGLE-3 drafter, the default since it drafts
    better (tau 3.09 vs 2.83); gemma3-270m-mtp: the MTP drafter, the Gemma-4 E2B assistant's shape, its table derived
    from the target (only P is stored). Both stay under 25 MB. `builtin` resolves to the default, except for a format
    some runtime of which runs no EAGLE-3 drafter (none of the shipped ones since 2026-12-07), which gets the MTP one;
    `builtin:FAMILY` names one."""
    from edge_spec.api import BUILTIN_DRAFTERS, builtin_drafters, default_drafter, resolve_drafter
    from edge_spec.errors import CheckpointError
    from edge_spec.loading.speculators_eagle3 import read_eagle3_config
    from edge_spec.model.drafter_sizes import BUDGET_BYTES

    shipped = builtin_drafters("gemma3-270m")
    assert list(shipped) == ["eagle3", "mtp"]
    assert shipped == {"eagle3": BUILTIN_DRAFTERS / "gemma3-270m", "mtp": BUILTIN_DRAFTERS / "gemma3-270m-mtp"}
    for folder in shipped.values():
        assert (folder / "model.safetensors").stat().st_size <= BUDGET_BYTES
        assert "ai.google.dev/gemma/terms" in (folder / "NOTICE").read_text()
    drafter = load_drafter(shipped["mtp"])
    text = drafter.cfg.raw["text_config"]
    assert drafter.cfg.raw["edge_spec"]["table_from"] == "target" and drafter.cfg.vocab_size == 262_144
    assert (text["hidden_size"], text["num_hidden_layers"], text["num_attention_heads"]) == (256, 4, 4)
    assert text["layer_types"] == ["sliding_attention"] * 3 + ["full_attention"]
    assert (drafter.cfg.num_centroids, drafter.cfg.top_k_clusters) == (2048, 32)
    assert read_eagle3_config(shipped["eagle3"]).draft_vocab_size == 6144

    assert default_drafter("gemma3-270m") == "builtin"
    assert resolve_drafter("builtin", "gemma3-270m") == shipped["eagle3"]
    for fmt in ("onnx", "executorch", "qnn", "coreml"):  # every runtime of these formats runs it, the native runner too
        assert resolve_drafter("builtin", "gemma3-270m", fmt=fmt) == shipped["eagle3"]
    assert resolve_drafter("builtin", "gemma3-270m", fmt="toy") == shipped["mtp"]  # a format outside the list
    assert resolve_drafter("builtin:eagle3", "gemma3-270m", fmt="coreml") == shipped["eagle3"]
    assert resolve_drafter("builtin:mtp", "gemma3-270m", fmt="onnx") == shipped["mtp"]
    with pytest.raises(CheckpointError, match="no built-in drafter"):
        resolve_drafter("builtin", "some/folder")


@pytest.mark.parametrize("precision", ["int8", "int4"])
def test_quantized_bundle_stores_the_derived_table_quantized_and_stays_exact(target, tmp_path, precision):
    """int8 / int4 bundles: the drafter's derived table [V, Ha] and the target's tied table are quantized on the
    head's grid (int8: 8-bit Q8_0, read by GatherBlockQuantized; int4: 4-bit with zero points, gathered by plain
    ops: exporters/onnx_tables.py), no float copy of either; greedy speculative == plain."""
    import onnx

    from edge_spec.api import load_bundle
    from edge_spec.contract import kv
    from edge_spec.exporters.onnx import export_bundle

    drafter = derived(target)
    folder = export_bundle(target, tmp_path / "b", drafter=drafter, max_context=96, precision=precision)
    graph = onnx.load(str(next(folder.rglob("drafter.onnx"))), load_external_data=False).graph
    shapes = {tuple(t.dims): t.data_type for t in graph.initializer}
    vocab, blocks = target.config.vocab_size, ARGS["hidden_size"] // 32
    assert (vocab, ARGS["hidden_size"]) not in shapes  # the float table is gone...
    bits = 8 if precision == "int8" else 4
    assert shapes[(vocab, blocks, 32 * bits // 8)] == onnx.TensorProto.UINT8  # ...its codes are there
    if bits == 8:
        assert sum(n.op_type == "GatherBlockQuantized" for n in graph.node) >= 2  # its table and the target's
        assert [t.name for t in graph.input if t.name.startswith("embed_table")] == [kv.EMBED_Q8, kv.EMBED_SCALES]
    else:
        assert shapes[(vocab * -(-blocks // 2),)] == onnx.TensorProto.UINT8  # its zero points
        assert [t.name for t in graph.input if t.name.startswith("embed_table")] == [
            kv.EMBED_Q4, kv.EMBED_SCALES, kv.EMBED_ZERO_POINTS]
    engine = load_bundle(folder, threads=1)
    ids = prompt_ids(11, seed=4)
    plain = engine.generate(ids, max_new_tokens=24, speculative=False).tokens
    spec = engine.generate(ids, max_new_tokens=24, spec_k=2, lookup=False, adaptive=False)
    assert spec.tokens == plain and spec.extra["spec"].drafter_calls > 0


def test_the_shipped_smollm2_drafters_and_builtin_per_format():
    """edge_spec/assets/drafters/smollm2-135m (docs/drafter.md): the EAGLE-3 drafter (chunk 3), the default since
    2026-12-07, as it drafts better than the MTP v4 on every measure taken (QNN's 16a8w graphs too, docs/android-qnn.md);
    smollm2-135m-mtp: the MTP v4 drafter (`builtin:mtp`). Both under 25 MB."""
    from edge_spec.api import BUILTIN_DRAFTERS, builtin_drafters, default_drafter, resolve_drafter
    from edge_spec.loading.speculators_eagle3 import read_eagle3_config
    from edge_spec.model.drafter_sizes import BUDGET_BYTES

    shipped = builtin_drafters("smollm2-135m")
    assert shipped == {"eagle3": BUILTIN_DRAFTERS / "smollm2-135m", "mtp": BUILTIN_DRAFTERS / "smollm2-135m-mtp"}
    assert list(shipped) == ["eagle3", "mtp"]  # the default first
    for folder in shipped.values():
        assert (folder / "model.safetensors").stat().st_size <= BUDGET_BYTES
    e3 = read_eagle3_config(shipped["eagle3"])
    assert (e3.draft_vocab_size, e3.aux_layer_ids, e3.norm_before_residual) == (8192, (2, 15, 27), True)
    mtp = load_drafter(shipped["mtp"])
    assert mtp.cfg.vocab_size == 49_152 and mtp.cfg.num_centroids > 0

    assert default_drafter("smollm2-135m") == "builtin"
    for fmt in (None, "onnx", "executorch", "qnn", "coreml"):
        assert resolve_drafter("builtin", "smollm2-135m", fmt=fmt) == shipped["eagle3"]
    assert resolve_drafter("builtin", "smollm2-135m", fmt="toy") == shipped["mtp"]  # a format outside the list
    assert resolve_drafter("builtin:mtp", "smollm2-135m", fmt="onnx") == shipped["mtp"]
