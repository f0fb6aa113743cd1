"""The native runner on a QNN bundle with an EAGLE-3 drafter (runtimes/native/src/fixed_eagle3.{h,cpp}, the qnn
backend's aux states): the same tokens, drafts and acceptance as the Python runtime (runtimes/fixed_eagle3.py) through
the CPU QDQ graphs and on the simulated HTP, the phone bundle (position 0 from its table, aux states included) too.

The bundles: tests/test_eagle3_qnn.py's (a tiny random llama + a tiny random Speculators drafter, 16a8w, lengths 5
and 9)."""

from __future__ import annotations

import numpy as np
import pytest

from edge_spec.api import load_bundle
from edge_spec.decoding.generate import generate_plain
from edge_spec.decoding.speculative import accept_all, generate_speculative
from tests.test_eagle3_onnx import target  # noqa: F401 (a fixture)
from tests.test_eagle3_qnn import _export, exported  # noqa: F401 (a fixture)
from tests.test_native import native  # noqa: F401 (the build fixture)
from tests.test_native_eagle3 import GREEDY, TOKENS, host_check_cache, ids_flag, prompt, serve  # noqa: F401
from tests.test_native_qnn import qnn_native  # noqa: F401 (the build, with the qnn backend)

FIXED = ["--fixed-k", "--no-lookup", "--ignore-eos", "--max-new-tokens", str(TOKENS)]


def _python(folder, provider):
    return load_bundle(folder, provider=provider, threads=2)


def test_the_cpu_provider_drafts_and_accepts_as_python(qnn_native, exported, monkeypatch):  # noqa: F811
    """Through the QDQ graphs: greedy speculative at k = 1, 2, 4 == plain == the Python runtime's, with the same
    acceptance at every position; then a verifier that accepts every draft (the tokens are the drafts: equal only if
    every burst pads, chunks and rebuilds the drafter's rows alike) over a prompt at k = 2 and 4 (rows kept), with
    token 4 changed (rows 4.. dropped), with token 0 changed (every row dropped), and a prompt longer than the longest
    graph (a first step in two chunks)."""
    folder, _ = exported
    monkeypatch.setenv("EDGE_SPEC_QNN_PROVIDER", "cpu")
    base = prompt(7, 9)
    accepts = [(base, 2), (base, 4), (base[:4] + [base[4] + 1] + base[5:], 4), ([base[0] + 1] + base[1:], 3),
               (prompt(8, 14), 4)]
    runs = [(k, prompt(10 * k)) for k in (1, 2, 4)]
    requests = [[*ids_flag(ids), "--no-spec", *FIXED] for _, ids in runs]
    requests += [[*ids_flag(ids), "--spec-k", k, *FIXED] for k, ids in runs]
    requests += [[*ids_flag(ids), "--spec-k", k, "--test-accept-all", *FIXED] for ids, k in accepts]
    head, results = serve(qnn_native, folder, requests)
    assert "QDQ on CPU provider" in head["host_check"]["runtime"]
    engine = _python(folder, "cpu")
    for i, (k, ids) in enumerate(runs):
        plain = generate_plain(engine.session, ids, max_new_tokens=TOKENS, params=GREEDY, rng=np.random.default_rng(0),
                               stop_ids=frozenset()).tokens
        theirs = generate_speculative(engine.session, engine.drafter, ids, max_new_tokens=TOKENS, params=GREEDY,
                                      rng=np.random.default_rng(0), stop_ids=frozenset(), k=k,
                                      vocab_size=engine.vocab_size, lookup=False)
        ours = results[len(runs) + i]
        assert results[i]["tokens"] == plain == theirs.tokens == ours["tokens"], f"k={k}"
        assert ours["drafter_calls"] == theirs.extra["spec"].drafter_calls > 0
        assert ours["accepted"] == [int(a) for a in theirs.extra["spec"].accepted], f"k={k}"
    for i, (ids, k) in enumerate(accepts):
        ours = results[2 * len(runs) + i]
        theirs = generate_speculative(engine.session, engine.drafter, ids, max_new_tokens=TOKENS, params=GREEDY,
                                      rng=np.random.default_rng(0), stop_ids=frozenset(), k=k,
                                      vocab_size=engine.vocab_size, verifier=accept_all)
        assert ours["tokens"] == theirs.tokens, f"accept-all request {i}: k={k}"
        assert sum(ours["accepted"]) >= 10


@pytest.mark.parametrize("position0", ["graph", "table"])
def test_the_htp_speculates_as_python(qnn_native, exported, target, tmp_path, monkeypatch, position0):  # noqa: F811
    """On the simulated HTP (context binaries, QNN EP): greedy k = 2 == plain == the Python runtime's, drafts accepted
    alike (an accept-all run), for the default bundle (position 0 on the host) and the phone bundle (position 0 from
    its table, the target's aux states included: a first step reads them); the host check passes."""
    folder = exported[0] if position0 == "graph" else _export(target, tmp_path / "phone", position0="table")[0]
    monkeypatch.setenv("EDGE_SPEC_QNN_PROVIDER", "qnn")
    engine = _python(folder, "qnn")
    first = engine.session.backend.first_token  # the phone bundle holds position 0 for its table's tokens only
    ids = ([first] if first is not None else []) + prompt(5, 8)
    requests = [[*ids_flag(ids), "--no-spec", *FIXED], [*ids_flag(ids), "--spec-k", 2, *FIXED],
                [*ids_flag(ids), "--spec-k", 2, "--test-accept-all", *FIXED]]
    head, results = serve(qnn_native, folder, requests)
    assert "HTP sm8650" in head["host_check"]["runtime"] and head["host_check"]["verdict"].startswith("exact")
    plain = generate_plain(engine.session, ids, max_new_tokens=TOKENS, params=GREEDY, rng=np.random.default_rng(0),
                           stop_ids=frozenset()).tokens
    assert results[0]["tokens"] == results[1]["tokens"] == plain and results[1]["drafter_calls"] > 0
    theirs = generate_speculative(engine.session, engine.drafter, ids, max_new_tokens=TOKENS, params=GREEDY,
                                  rng=np.random.default_rng(0), stop_ids=frozenset(), k=2,
                                  vocab_size=engine.vocab_size, verifier=accept_all)
    assert results[2]["tokens"] == theirs.tokens
