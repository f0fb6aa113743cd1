"""The static datastore (edge_spec.decoding.datastore): proposals equal a brute-force scan of the text, the file
round-trips, and a bad or corrupt file fails with a BundleError that says how to fix it."""

import struct

import numpy as np
import pytest

from edge_spec.decoding.datastore import HEADER, Datastore
from edge_spec.decoding.datastore_source import read_answers, regenerated_folder
from edge_spec.errors import BundleError, ConfigError


def brute_force(docs, context, k, min_n=2, max_n=8, k_max=8, min_share=50):
    """The definition, by scanning every document: the longest suffix with a continuation, then the walk."""
    def occurrences(pattern):  # (doc, start after the pattern) for every occurrence
        m = len(pattern)
        return [(d, s + m) for d, doc in enumerate(docs) for s in range(len(doc) - m + 1)
                if list(doc[s:s + m]) == list(pattern)]

    best = None
    for n in range(min_n, min(max_n, len(context)) + 1):
        occ = occurrences(context[-n:])
        if not any(e < len(docs[d]) for d, e in occ):
            break
        best = occ
    draft = []
    while best and len(draft) < min(k, k_max):
        nexts = [docs[d][e] for d, e in best if e < len(docs[d])]
        if not nexts:
            break
        counts = {}
        for t in nexts:
            counts[t] = counts.get(t, 0) + 1
        token = min(counts, key=lambda t: (-counts[t], t))
        if 100 * counts[token] < min_share * len(best):
            break
        draft.append(token)
        best = [(d, e + 1) for d, e in best if e < len(docs[d]) and docs[d][e] == token]
    return draft


def test_hand_built_proposals():
    docs = [[1, 2, 3, 4, 5], [1, 2, 3, 4, 6], [1, 2, 3, 9], [7, 2, 3, 4, 5, 8]]
    ds = Datastore.build(docs, vocab_size=10)
    assert ds.propose([0, 2, 3], 4) == [4, 5, 8]  # "2 3": 4 (3 of 4), 5 (2 of 3), 8 (1 of 2: 50% is enough)
    assert ds.propose([1, 2, 3], 4) == [4, 5]  # "1 2 3" (n = 3): 4 (2 of 3), {5, 6} tie: 5; then a document's end
    assert ds.propose([7, 2, 3], 1) == [4]
    assert ds.propose([5, 5], 3) == []  # no bigram matches
    assert ds.propose([3, 9], 3) == []  # occurs, but only at a document's end
    assert ds.propose([1, 2], 0) == []
    assert ds.candidates(*ds.match([0, 2, 3])[1:], 2) == [(4, 3), (9, 1)]
    strict = Datastore.build(docs, vocab_size=10, min_share=80)
    assert strict.propose([0, 2, 3], 4) == []  # 4 holds 3 of 4 occurrences: 75% < 80%


def test_ties_break_to_the_lowest_id():
    ds = Datastore.build([[1, 2, 9], [1, 2, 5], [1, 2, 7]], vocab_size=10, min_share=0)
    assert ds.propose([1, 2], 2) == [5]


def test_proposals_equal_the_brute_force_definition_on_random_text():
    rng = np.random.default_rng(0)
    for trial in range(12):
        params = dict(min_n=int(rng.integers(1, 3)), max_n=int(rng.integers(3, 6)), k_max=int(rng.integers(2, 6)),
                      min_share=int(rng.choice([0, 30, 50])))
        docs = [[int(t) for t in rng.integers(0, 5, int(rng.integers(1, 40)))] for _ in range(int(rng.integers(1, 8)))]
        ds = Datastore.build(docs, vocab_size=6, **params)
        again = Datastore.from_bytes(ds.to_bytes())
        for _ in range(40):
            ctx = [int(t) for t in rng.integers(0, 6, int(rng.integers(1, 9)))]
            for k in (1, 3, 8):
                want = brute_force(docs, ctx, k, **params)
                assert ds.propose(ctx, k) == want, (trial, ctx, k)
                assert again.propose(ctx, k) == want


def test_the_file_round_trips_and_is_small_for_a_real_target():
    folder = regenerated_folder("smollm2-135m")
    if folder is None:
        pytest.skip("no committed regenerated answers (an installed wheel)")
    docs = read_answers(folder)
    ds = Datastore.build(docs, vocab_size=49152)
    data = ds.to_bytes()
    assert len(data) <= 10 * 2**20
    back = Datastore.from_bytes(data, vocab_size=49152)
    assert np.array_equal(back.tokens, ds.tokens) and np.array_equal(back.index, ds.index)
    doc = docs[3]
    assert back.propose(doc[:20], 4) == ds.propose(doc[:20], 4) and len(ds.propose(doc[:20], 4)) >= 1


def _corrupt(data: bytes, offset: int, value: int) -> bytes:
    return data[:offset] + struct.pack("<I", value) + data[offset + 4:]


def test_bad_files_fail_with_the_fix(tmp_path):
    ds = Datastore.build([[1, 2, 3, 4], [2, 3, 5]], vocab_size=10)
    good = ds.to_bytes()
    n_tokens = len(ds.tokens)
    cases = {
        "shorter than": good[:10],
        "not an edge-spec datastore": b"XXXXXXXX" + good[8:],
        "version 9": _corrupt(good, 8, 9),
        "truncated or altered": good[:-4],
        "n-gram lengths": _corrupt(good, 12, 0),  # min_n 0
        "does not end with a separator": _corrupt(good, HEADER.size + 4 * (n_tokens - 1), 3),
        "token id is >=": _corrupt(good, HEADER.size, 12),
        "every text position exactly once": _corrupt(good, HEADER.size + 4 * n_tokens, 4),  # index -> a SEP
        "not sorted": good[:HEADER.size + 4 * n_tokens] + ds.index[::-1].astype("<u4").tobytes(),
    }
    for what, data in cases.items():
        with pytest.raises(BundleError, match=what) as err:
            Datastore.from_bytes(data, where="x/datastore.bin")
        assert "re-export" in str(err.value) or "update edge-spec" in str(err.value)
    with pytest.raises(BundleError, match="vocabulary of 10, the target's is 11"):
        Datastore.from_bytes(good, vocab_size=11)
    with pytest.raises(BundleError, match="cannot read"):
        Datastore.load(tmp_path / "missing.bin")
    with pytest.raises(ConfigError, match="outside"):
        Datastore.build([[1, 99]], vocab_size=10)
    with pytest.raises(ConfigError, match="n-gram lengths"):
        Datastore.build([[1]], vocab_size=10, min_n=3, max_n=2)


def test_manifest_datastore_key_is_checked(tmp_path):
    from edge_spec.contract.datastore_check import check_datastore, datastore_entry

    files = {"datastore.bin": {"sha256": "0" * 64, "bytes": 48}}
    check_datastore(None, files, tmp_path)  # no datastore: nothing to check
    check_datastore(datastore_entry("datastore.bin", 10, 2, "x"), files, tmp_path)
    bad = {"a list": ([], "not an object"), "outside": ({"file": "../x.bin"}, "not a file inside"),
           "unlisted": ({"file": "other.bin"}, "no checksum entry"),
           "version": (datastore_entry("datastore.bin", 1, 1, "x") | {"version": 2}, "reads version 1"),
           "tokens": (datastore_entry("datastore.bin", -1, 1, "x"), "datastore.tokens")}
    for name, (entry, what) in bad.items():
        with pytest.raises(BundleError, match=what) as err:
            check_datastore(entry, files, tmp_path)
        assert "fix:" in str(err.value) or "re-export" in str(err.value), name


def test_cost_model_gives_the_datastore_its_own_track():
    from edge_spec.decoding.speculative import CostModel

    model = CostModel(k_max=4)
    model.observe_verify(1, 0.010)
    model.observe_verify(5, 0.016)
    model.observe_draft(0.003)
    for _ in range(20):
        model.observe_acceptance(4, 4, lookup=True)  # retrieval: accepted whole
        model.observe_acceptance(4, 1, lookup="datastore")  # the datastore: its first draft only
    assert model.expected_tokens(4, lookup="datastore") == pytest.approx(2.0, abs=0.02)
    assert model.expected_tokens(4, lookup=True) == pytest.approx(5.0, abs=0.02)
    assert model.expected_tokens(4) == pytest.approx(1 + 0.6 + 0.36 + 0.216 + 0.1296)  # the drafter's prior, untouched
    assert model.choose(lookup="datastore") in (1, 2)  # no draft cost: a short burst beats a plain step
    with pytest.raises(ValueError):
        model.choose(lookup="elsewhere")
