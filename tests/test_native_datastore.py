"""The static datastore in the native runner (runtimes/native/src/datastore.cpp) against edge_spec.decoding.datastore:
the same drafts token for token from the same datastore.bin, the same refusals of a damaged file, and a bundle that
ships one generating the Python runtime's tokens with the same datastore passes (and none with --no-datastore).

Built as tests/test_native.py builds the runner (build/native; $ES_NATIVE_BUILD names another build folder).
"""

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from edge_spec.contract.datastore_check import DATASTORE_FILE, datastore_entry
from edge_spec.decoding.datastore import Datastore
from edge_spec.decoding.datastore_source import read_answers, regenerated_folder
from edge_spec.decoding.sampling import SamplingParams
from edge_spec.decoding.speculative import generate_speculative
from edge_spec.loading import checkpoints
from tests.parity import prompt_ids
from tests.test_native import native as _built, run  # noqa: F401 (the build fixture, the CLI helper)

TOKENS = 40


@pytest.fixture(scope="module")
def native(request):
    """$ES_NATIVE_BUILD (a build folder made as `make native` makes it), else tests/test_native.py's build."""
    given = os.environ.get("ES_NATIVE_BUILD")
    return Path(given) if given else request.getfixturevalue("_built")


def native_drafts(native, path: Path, vocab: int, queries: list[tuple[int, list[int]]]):
    lines = "".join(f"{k} {' '.join(map(str, ctx))}\n" for k, ctx in queries)
    done = subprocess.run([str(native / "datastore_vectors_test"), str(path), str(vocab)], input=lines,
                          capture_output=True, text=True, timeout=120)
    return done, [[int(t) for t in line.split()] for line in done.stdout.splitlines()]


def test_native_drafts_equal_the_python_drafts(native, tmp_path):
    folder = regenerated_folder("smollm2-135m")
    rng = np.random.default_rng(0)
    if folder is not None:  # the real text: long runs, common n-grams with many continuations
        docs, vocab = read_answers(folder)[:300], 49152
    else:
        docs, vocab = [[int(t) for t in rng.integers(0, 30, 200)] for _ in range(50)], 30
    cases = [Datastore.build(docs, vocab_size=vocab), Datastore.build(docs, vocab_size=vocab, min_n=1, max_n=5,
                                                                         k_max=6, min_share=0)]
    for i, store in enumerate(cases):
        path = tmp_path / f"{i}.bin"
        store.save(path)
        queries = []
        for _ in range(400):
            doc = docs[int(rng.integers(len(docs)))]
            end = int(rng.integers(1, len(doc) + 1))
            ctx = doc[max(0, end - int(rng.integers(1, 10))):end]
            if rng.random() < 0.3:  # a changed token: shorter matches, or none
                ctx = ctx[:-1] + [int(rng.integers(vocab))]
            queries.append((int(rng.integers(1, 10)), [int(t) for t in ctx]))
        done, ours = native_drafts(native, path, vocab, queries)
        assert done.returncode == 0, done.stderr
        theirs = [store.propose(ctx, k) for k, ctx in queries]
        assert ours == theirs
        assert sum(map(bool, theirs)) > 100  # most contexts draft


def test_native_refuses_a_damaged_datastore(native, tmp_path):
    store = Datastore.build([[1, 2, 3, 4], [2, 3, 5]], vocab_size=10)
    good = store.to_bytes()
    for what, data, vocab in (("truncated or altered", good[:-4], 10), ("not an edge-spec datastore", b"X" * 48, 10),
                              ("vocabulary of 10", good, 11),
                              ("not sorted", good[:40 + 4 * len(store.tokens)] + store.index[::-1].astype("<u4").tobytes(), 10)):
        path = tmp_path / "bad.bin"
        path.write_bytes(data)
        done, _ = native_drafts(native, path, vocab, [(4, [2, 3])])
        assert done.returncode == 2 and what in done.stderr and "fix:" in done.stderr, (what, done.stderr)


def test_bundle_datastore_drafts_the_same_in_both_runtimes(native, tiny_llama, tmp_path):
    """A tiny ONNX bundle shipping a datastore.bin that holds the target's own continuation of the prompt: the native
    runner's greedy tokens == the Python runtime's == plain, with the same datastore passes and tau, fixed k and
    adaptive; --no-datastore drafts none from it."""
    from edge_spec.api import load_bundle
    from edge_spec.exporters.onnx import export_bundle
    from tests.test_onnx import tiny_drafter

    if "onnx" not in (native / "formats.txt").read_text().split():
        pytest.skip(f"{native} was built without the onnx backend")
    target = checkpoints.load(str(tiny_llama[0]))
    ids = prompt_ids(9, seed=2)
    plain = run(native, _export(target, tmp_path / "plain", None), ids, "--no-spec", "--ignore-eos",
                "--max-new-tokens", str(TOKENS))["tokens"]
    store = Datastore.build([ids[-3:] + plain[:20], plain[25:35]], vocab_size=target.config.vocab_size)
    bundle = _export(target, tmp_path / "with", store)
    engine = load_bundle(bundle, threads=2)
    assert engine.datastore is not None and engine.manifest.datastore["file"] == DATASTORE_FILE
    for k, extra in ((4, ["--fixed-k"]), (2, ["--fixed-k", "--no-lookup"])):
        ours = run(native, bundle, ids, "--spec-k", str(k), "--ignore-eos", "--max-new-tokens", str(TOKENS), *extra)
        theirs = generate_speculative(engine.session, engine.drafter, ids, max_new_tokens=TOKENS,
                                      params=SamplingParams(), rng=np.random.default_rng(0), stop_ids=frozenset(), k=k,
                                      vocab_size=engine.vocab_size, lookup="--no-lookup" not in extra,
                                      datastore=engine.datastore)
        stats = theirs.extra["spec"]
        assert ours["tokens"] == theirs.tokens == plain
        assert ours["datastore_passes"] == stats.datastore_passes > 0 and stats.datastore_accepted > 0
        assert ours["tau"] == pytest.approx(stats.tau, abs=1e-6)
    adaptive = run(native, bundle, ids, "--spec-k", "4", "--adaptive", "--ignore-eos", "--max-new-tokens", str(TOKENS))
    assert adaptive["tokens"] == plain
    off = run(native, bundle, ids, "--spec-k", "4", "--fixed-k", "--no-datastore", "--ignore-eos", "--max-new-tokens",
              str(TOKENS))
    assert off["tokens"] == plain and off["datastore_passes"] == 0
    # `edge-spec bench --runtime native --no-datastore` sends the flag with each request (edge_spec.benchmark.native)
    from edge_spec.benchmark.native import NativeRunner

    runner = NativeRunner(native / "edge-spec-run", bundle, 1)
    try:
        with_store, without = (runner.generate(ids, max_new_tokens=TOKENS, k=4, adaptive=False, temperature=0.0, seed=0,
                                               datastore=flag) for flag in (True, False))
    finally:
        runner.close()
    assert with_store["datastore_passes"] > 0 and without["datastore_passes"] == 0


def _export(target, out, store):
    from edge_spec.exporters.onnx import export_bundle
    from tests.test_onnx import tiny_drafter

    def write(tmp, content_sha256):
        store.save(tmp / DATASTORE_FILE)
        return datastore_entry(DATASTORE_FILE, len(store.tokens), 2, "test")

    return export_bundle(target, out, drafter=tiny_drafter(target.config, head_from="target"), precision="fp32",
                         max_context=160, binding="io", datastore=write if store is not None else None)
