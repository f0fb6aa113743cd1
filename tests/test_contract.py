"""The contract, once for every format: each claim below runs over the rows of tests/contract.py (format x model
family x KV binding, the toy format of tests/test_toy_format.py included) on the tiny bundles its factory exports
once per session. What only one format has (its files, its precisions, its options) stays in its own test file.

Each row's tests share the xdist group of the per-format file that builds the same bundles, so a bundle is exported
on one worker only.
"""

import json
import re
from pathlib import Path

import numpy as np
import pytest

from edge_spec.api import load_bundle
from edge_spec.cli import main
from edge_spec.contract import formats
from edge_spec.contract.bundle import export_bundle
from edge_spec.contract.manifest import MANIFEST, content_id
from edge_spec.decoding.generate import generate_plain
from edge_spec.decoding.sampling import SamplingParams
from edge_spec.decoding.speculative import generate_speculative
from edge_spec.errors import BundleError, CheckpointError
from edge_spec.loading import checkpoints
from tests.contract import (DRAFTERS, ROWS, OracleDrafter, copy_bundle, differing_windows, host_checked_session,
                            rehash, round_kv_to_fp16, tiny_drafter)
from tests.parity import LOGITS_TOL, assert_drafter_matches_eager, assert_target_matches_eager, prompt_ids
from tests.tiers import LONG

GREEDY = SamplingParams()


def rows(where=lambda row: True, runs=False):
    """The rows `where` accepts as pytest params, each in its bundle's xdist group (`runs`: one param per runtime
    option set the row claims exactness under, as (row, options))."""
    out = []
    for row in filter(where, ROWS):
        mark = (pytest.mark.xdist_group(row.group), *((LONG,) if row.long else ()))
        if runs:
            out += [pytest.param(row, opts, id="-".join(filter(None, (row.id, name))), marks=mark)
                    for name, opts in row.runs]
        else:
            out.append(pytest.param(row, id=row.id, marks=mark))
    return out


@pytest.fixture
def bundle(row, tiny_bundles, request, monkeypatch):
    """(folder, target, drafter) of the row, with the environment its runtime needs here."""
    for name, value in row.env:
        monkeypatch.setenv(name, value)
    if row.format == "toy":
        request.getfixturevalue("toy_format")  # registered before anything exports or reads its bundle
    return tiny_bundles(row)


@pytest.fixture
def toy_format():
    """The toy format of tests/test_toy_format.py, registered for one test (unless its own module holds it), so that
    no other test on this worker sees a sixth format."""
    from tests.test_toy_format import ROW

    if formats.FORMATS.get(ROW.name) is ROW:
        yield ROW
        return
    with formats.registered(ROW):
        yield ROW


# ---- parity with eager --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("row", rows(lambda r: r.tol is not None))
def test_target_logits_match_eager(row, bundle, monkeypatch):
    """Logits and hidden states within the row's tolerance of eager through chunked prefill, passes of 1-4 tokens,
    random accepted prefixes, rewinds and a reset (tests/parity.py)."""
    if row.format == "onnx":
        from edge_spec.runtimes import ort

        monkeypatch.setattr(ort, "BUCKET", 8)  # many bucket moves (grow and shrink) in a short test
    if row.fp16_kv:
        round_kv_to_fp16(monkeypatch)
    assert_target_matches_eager(bundle[0], bundle[1], threads=row.threads or 1, tol=row.tol)


@pytest.mark.parametrize("row", rows(lambda r: r.tol is not None and r.drafter and
                                   (r.drafter_kind == "mtp" or r.tol == LOGITS_TOL)))
def test_drafter_steps_match_eager(row, bundle, monkeypatch):
    """The bundle's drafter, reading the caches its target wrote: same candidates (a clustered head's selection
    included), logits and next hidden as the eager drafter reading the eager target's. An EAGLE-3 drafter (fp32 rows):
    under a verifier that accepts every draft the tokens are the drafts, and they are eager's (every burst rebuilds
    the drafter's own rows from the target's aux states alike; tests/eagle3_checks.py)."""
    if row.fp16_kv:
        round_kv_to_fp16(monkeypatch)
    if row.drafter_kind == "eagle3":
        from edge_spec.contract.layout import kv_layout
        from edge_spec.runtimes.torch_eagle3 import eagle3_pair
        from tests.eagle3_checks import assert_accept_all_as_eager

        folder, target, drafter = bundle
        engine = load_bundle(folder, threads=row.threads, host_check=False)
        eager = eagle3_pair(target.model, drafter, kv_layout(target.config, row.export["max_context"]))
        assert_accept_all_as_eager(engine, eager, prompt_ids(10, seed=7), 4, 24, target.config.vocab_size)
        return
    assert_drafter_matches_eager(*bundle, threads=row.threads or 1, tol=row.tol)


# ---- exactness ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("row", rows())
def test_verify_rows_are_bit_identical_to_decode_steps(row, bundle):
    """The property greedy exactness rests on: in the row mode the host check picks, a verify pass gives, row for
    row, the bits of one-token decode steps over the same tokens, across bucket edges and (gemma) ring wraps."""
    session = host_checked_session(bundle[0], **row.exact_run)
    n, windows = row.verify
    assert differing_windows(session, prompt_ids(n, seed=5), windows) == []


@pytest.mark.parametrize("row, run", rows(runs=True))
def test_speculative_greedy_equals_plain_greedy(row, run, bundle):
    """The host check (probed afresh) finds the bundle exact here, and then greedy speculative decoding with the
    bundle's drafter gives plain greedy decoding's tokens at k = 1, 2, 4, speculation having run."""
    engine = load_bundle(bundle[0], threads=row.threads, host_check=False, **run)
    check = engine.check_host(cache=False)
    assert check.exact, check.report()
    ids = prompt_ids(9, seed=1)
    plain = engine.generate(ids, max_new_tokens=row.spec_tokens, speculative=False)
    for k in (1, 2, 4):
        spec = engine.generate(ids, max_new_tokens=row.spec_tokens, spec_k=k, lookup=False, adaptive=False)
        assert spec.tokens == plain.tokens and "spec" in spec.extra, f"k={k}"


WRONG = {"never": lambda rng: lambda p: False, "always": lambda rng: lambda p: True,
         "every third": lambda rng: lambda p: p % 3 == 0, "random": lambda rng: lambda p: rng.random() < 0.4}


@pytest.mark.parametrize("wrong", list(WRONG))
@pytest.mark.parametrize("row", rows(lambda r: r.family == "gemma"))
def test_rejected_drafts_never_change_the_output(row, bundle, wrong):
    """Whatever the drafter proposes (accepted bursts, rejected ones whose rows a program may already have written
    into its caches), greedy speculative output equals plain greedy output, over tokens that wrap the rings."""
    session = load_bundle(bundle[0], threads=row.threads, **row.exact_run).session
    prompt = prompt_ids(11, seed=1)
    expected = generate_plain(session, prompt, max_new_tokens=row.reject_tokens, params=GREEDY,
                              rng=np.random.default_rng(0), stop_ids=frozenset()).tokens
    drafter = OracleDrafter(expected, len(prompt), WRONG[wrong](np.random.default_rng(7)))
    out = generate_speculative(session, drafter, prompt, max_new_tokens=row.reject_tokens, params=GREEDY,
                               rng=np.random.default_rng(0), stop_ids=frozenset(), k=4, vocab_size=320)
    assert out.tokens == expected
    tau = out.extra["spec"].tau  # so that each rule did what it says: every burst accepted, none, some
    assert {"never": tau > 4.0, "always": tau == 1.0, "every third": 1.5 < tau < 4.0,
            "random": 1.0 < tau < 4.0}[wrong], tau


# ---- refusals -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("row", rows(lambda r: r.drafter))
def test_a_drafter_of_another_target_is_refused(row, bundle, tiny_bundles, tmp_path):
    """At export (before the format writes anything), and at load when a manifest pairs the drafter with another
    target (the other tiny family's content hash)."""
    other = "gemma" if row.family == "llama" else "llama"
    other_target = checkpoints.load(str(tiny_bundles.checkpoints[other]))
    wrong = tiny_drafter(other_target.config, **DRAFTERS[other])
    with pytest.raises(CheckpointError, match="drafter does not match the target|target has no cached"):
        export_bundle(bundle[1], tmp_path / "x", format=row.format, drafter=wrong, **row.export)
    assert not (tmp_path / "x").exists()
    dst = copy_bundle(bundle[0], tmp_path / "bundle")
    raw = json.loads((dst / MANIFEST).read_text())
    raw["drafter"]["target_content_sha256"] = content_id(other_target.config.raw, other_target.model.state_dict())
    (dst / MANIFEST).write_text(json.dumps(raw))
    with pytest.raises(BundleError, match="drafter from another target"):
        load_bundle(dst, host_check=False)


@pytest.mark.parametrize("row", rows())
def test_damaged_bundles_are_refused_naming_the_file(row, bundle, tmp_path):
    """One of the format's files flipped in one bit, truncated, (where the runtime can tell) damaged with its
    checksums re-recorded, and missing; then a manifest of an unknown schema, and none: each refused at load,
    naming the file."""
    dst = copy_bundle(bundle[0], tmp_path / "bundle")
    path, name = dst / row.damage, re.escape(Path(row.damage).name)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10  # one bit
    path.write_bytes(bytes(data))
    with pytest.raises(BundleError, match=f"{name} is corrupt"):
        load_bundle(dst, host_check=False)
    path.write_bytes(bytes(data[:len(data) // 2]))
    with pytest.raises(BundleError, match=f"{name} is truncated"):
        load_bundle(dst, host_check=False)
    if row.unreadable:
        rehash(dst, row.damage)  # checksums re-recorded: only the runtime can tell now
        with pytest.raises(BundleError, match=row.unreadable) as err:
            load_bundle(dst, host_check=False)
        assert "re-export" in str(err.value)
    path.unlink()
    with pytest.raises(BundleError, match=f"{name} is missing"):
        load_bundle(dst, host_check=False)
    raw = json.loads((dst / MANIFEST).read_text())
    (dst / MANIFEST).write_text(json.dumps({**raw, "schema_version": 99}))
    with pytest.raises(BundleError, match="schema_version 99"):
        load_bundle(dst, host_check=False)
    (dst / MANIFEST).unlink()
    with pytest.raises(BundleError, match="manifest.json is missing"):
        load_bundle(dst, host_check=False)


# ---- the CLI --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("row", rows())
def test_cli_generates_the_same_text_with_and_without_speculation(row, bundle, tiny_bundles, tmp_path, capsys):
    """`generate --bundle`: speculative (host-checked) == --no-spec (== the eager runtime on the bundle's sources,
    for rows at the fp32 tolerance); another format's runtime option, another runtime and another format's
    precision are refused with exit 2."""
    fmt = formats.FORMATS[row.format]
    base = ["generate", "--bundle", str(bundle[0]), "--prompt", "w5 w6 w7", "--max-new-tokens", "10", "--quiet"]
    base += ["--threads", str(row.threads)] if row.threads else []
    runs = {"spec": [], "plain": ["--no-spec"]}
    if row.tol == LOGITS_TOL:
        runs["torch"] = ["--runtime", "torch", "--no-spec"]
    results = {}
    for name, extra in runs.items():
        code = main(base + extra)
        results[name] = (code, *capsys.readouterr())
    assert {r[0] for r in results.values()} == {0}, {name: r[2][-400:] for name, r in results.items()}
    assert results["spec"][1].strip() and len({r[1] for r in results.values()}) == 1
    spec_err, plain_err = results["spec"][2], results["plain"][2]
    assert f"[{fmt.runtime}]" in spec_err and "tau" in spec_err and "tau" not in plain_err
    assert "exactness: host-checked" in spec_err
    option = next(o for o in formats.all_options(formats.RUN) if fmt.option(o.dest, formats.RUN) is None)
    assert main(base + [option.flag] + ([option.choices[0]] if option.choices else [])) == 2
    err = capsys.readouterr().err
    assert f"{option.flag} applies to" in err and f"not the {fmt.runtime} runtime" in err
    runtime = next(f.runtime for f in formats.FORMATS.values() if f.name != row.format)
    assert main(["generate", "--bundle", str(bundle[0]), "--runtime", runtime, "--prompt", "w5"]) == 2
    assert f"does not run '{row.format}' bundles" in capsys.readouterr().err
    precision = next(p for p in formats.precisions() if p not in fmt.precisions)
    out = tmp_path / "x"
    assert main(["export", "--model", str(tiny_bundles.checkpoints[row.family]), "--format", row.format, "--quant",
                 precision, "--out", str(out)]) == 2
    assert f"no precision '{precision}'" in capsys.readouterr().err and not out.exists()
