"""Bad input to the native runner (`build/native/edge-spec-run`, runtimes/native), the cases a bad-input sweep found
(issue 43; the Python side's are tests/test_bad_input.py): 10,000 threads, numbers that wrapped or were cut
(`--max-new-tokens 1000000000000`, `2.7`, `--seed abc`), hand-edited manifests (a huge max_context, a wrong table
shape, `eos_token_ids: "abc"`), a junk line or an empty input on `--requests -`, a bundle path that is a file.

Each refusal is `error: ...` with a `fix: ...` line and exit code 2, before any work, and no runner process is left
behind (every run has a timeout; a run still alive after it fails the test). The runner is built as
tests/test_native.py builds it (its `native` fixture: skips the module when cmake or a C++ compiler is missing); the
bundle is the session's tiny llama .pte (tests/conftest.py), copied before a manifest is edited.
"""

import hashlib
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from edge_spec.contract.manifest import MANIFEST
from tests.test_native import native  # noqa: F401 (the build fixture)

TIMEOUT = 120
INT32_MAX = 2**31 - 1


def run_cli(native, *args, stdin=None):  # noqa: F811
    """(exit code, stdout, stderr) of one edge-spec-run; a run still alive after TIMEOUT is killed and fails."""
    proc = subprocess.Popen([str(native / "edge-spec-run"), *map(str, args)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(stdin or "", timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail(f"edge-spec-run {' '.join(map(str, args))} still ran after {TIMEOUT} s (killed)")
    assert proc.poll() is not None  # nothing left running
    return proc.returncode, out, err


def refused(code, err, *words):
    """Exit 2, an `error:` line then a `fix:` line (the runner's form: errors.h), each word in the message."""
    assert code == 2, err
    lines = err.splitlines()
    first = next((i for i, line in enumerate(lines) if line.startswith("error: ")), None)
    assert first is not None, err
    assert any(line.lstrip().startswith("fix: ") for line in lines[first + 1:]), err
    for w in words:
        assert w in err, err


def generate(native, bundle, *flags, ids="5,6,7"):  # noqa: F811
    return run_cli(native, "--bundle", bundle, "--prompt-ids", ids, "--max-new-tokens", "2", "--json", *flags)


@pytest.fixture
def copy(tiny_llama_pte, tmp_path):
    dst = tmp_path / "bundle"
    shutil.copytree(tiny_llama_pte, dst)
    return dst


def snapshot(folder: Path) -> dict:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def edit_manifest(folder: Path, change) -> None:
    data = json.loads((folder / MANIFEST).read_text())
    change(data, folder)
    (folder / MANIFEST).write_text(json.dumps(data))


# ---- 1. threads ----------------------------------------------------------------------------------------------------
def test_more_threads_than_cores_are_capped_with_a_notice(native, tiny_llama_pte):  # noqa: F811
    code, out, err = run_cli(native, "--bundle", tiny_llama_pte, "--check", "--fresh-check", "--threads", "10000")
    assert code == 0, err
    notice = re.search(r"notice: --threads 10000 is more than this machine's (\d+) cores; using (\d+)", err)
    assert notice and notice.group(1) == notice.group(2), err
    cores = int(notice.group(1))
    assert 1 <= cores < 10000 and cores == (os.cpu_count() or cores)
    assert f"XNNPACK, {cores} threads" in json.loads(out)["runtime"]  # the pool the program ran on
    code, out, err = generate(native, tiny_llama_pte, "--threads", "10000", "--no-spec")
    assert code == 0 and len(json.loads(out)["tokens"]) == 2 and "notice: --threads 10000" in err, err


@pytest.mark.parametrize("threads", ["0", "-3", "abc", "2.5"])
def test_threads_below_one_or_not_an_integer_are_refused(native, tiny_llama_pte, threads):  # noqa: F811
    code, out, err = generate(native, tiny_llama_pte, "--threads", threads)
    refused(code, err, f"--threads expects an integer in [1, {INT32_MAX}], got '{threads}'", "fix: pass --threads 1")
    assert out == ""


def test_the_c_api_caps_threads_and_refuses_negative_ones(native, tiny_llama_pte):  # noqa: F811
    """tests/c_api_test.c opens the bundle with threads = 100000 (opens, the backend's identity shows the core count)
    and -1 (ES_ERR_ARGUMENT naming threads), beside its other checks."""
    done = subprocess.run([str(native / "c_api_test"), str(tiny_llama_pte), "5,6,7,8", "8"], capture_output=True,
                          text=True, timeout=TIMEOUT)
    assert done.returncode == 0 and "FAIL" not in done.stderr, done.stderr
    assert json.loads(done.stdout)["failures"] == 0


# ---- 2. numbers: strict, in range, or refused before any work -----------------------------------------------------
NUMBERS = [
    ("--max-new-tokens", "1000000000000", f"an integer in [1, {INT32_MAX}]"),
    ("--max-new-tokens", "2.7", "an integer in [1, "),
    ("--max-new-tokens", "0", "an integer in [1, "),
    ("--max-new-tokens", "12abc", "an integer in [1, "),
    ("--seed", "abc", "an integer in [0, 18446744073709551615]"),
    ("--seed", "-5", "an integer in [0, "),
    ("--seed", "18446744073709551616", "an integer in [0, "),
    ("--top-k", "1.5", "an integer in [0, "),
    ("--spec-k", "0", "an integer in [1, "),
    ("--temperature", "nan", "a decimal number"),
    ("--temperature", "0x1p3", "a decimal number"),
    ("--top-p", "", "a decimal number"),
    ("--min-confidence", "0.3abc", "a decimal number"),
    ("--prompt-ids", "5,x,7", f"an integer in [0, {INT32_MAX}]"),
    ("--prompt-ids", "5,99999999999999999999", f"an integer in [0, {INT32_MAX}]"),
]


@pytest.mark.parametrize("flag,value,words", NUMBERS, ids=[f"{f}={v}" for f, v, _ in NUMBERS])
def test_numbers_are_parsed_strictly(native, tmp_path, flag, value, words):  # noqa: F811
    """The flags are checked before the bundle is opened: a missing bundle never gets to say so."""
    args = ["--bundle", tmp_path / "no-bundle-here", "--prompt-ids", "5,6", flag, value]
    code, out, err = run_cli(native, *args)
    shown = value if flag != "--prompt-ids" else next(v for v in value.split(",") if not v.isdigit() or len(v) > 10)
    refused(code, err, f"error: {flag} expects {words}", f"got '{shown}'")
    assert "no-bundle-here" not in err and out == ""


@pytest.mark.parametrize("flag,value,words", [
    ("--temperature", "-1", "temperature must be a finite number >= 0"),
    ("--top-p", "1.5", "top_p must be in (0, 1]"),
    ("--top-p", "0", "top_p must be in (0, 1]"),
    ("--min-confidence", "1", "min_confidence must be in [0, 1)"),
], ids=["temperature", "top-p", "top-p-zero", "min-confidence"])
def test_numbers_outside_their_range_are_refused_in_engine_words(native, tmp_path, flag, value, words):  # noqa: F811
    """Decimal flags: the range is the engine's check (the C API's wording too), run before the bundle is opened."""
    code, out, err = run_cli(native, "--bundle", tmp_path / "no-bundle-here", "--prompt-ids", "5,6", flag, value)
    refused(code, err, words)
    assert "no-bundle-here" not in err and out == ""


def test_the_brief_s_wording_for_a_wrapped_max_new_tokens(native, tiny_llama_pte):  # noqa: F811
    code, _, err = generate(native, tiny_llama_pte, "--max-new-tokens", "1000000000000")
    assert err.splitlines()[0] == ("error: --max-new-tokens expects an integer in [1, 2147483647], got "
                                   "'1000000000000'"), err
    refused(code, err, "fix: pass --max-new-tokens 1 or more")


def test_numbers_at_the_ends_of_their_ranges_are_taken(native, tiny_llama_pte):  # noqa: F811
    code, out, err = generate(native, tiny_llama_pte, "--seed", "18446744073709551615", "--temperature", "0.5",
                              "--top-p", "1", "--top-k", "0", "--min-confidence", "0", "--no-spec")
    assert code == 0 and len(json.loads(out)["tokens"]) == 2, err


@pytest.mark.parametrize("args,words", [
    (["--bogus"], "unknown option '--bogus'"),
    (["--max-new-tokens"], "--max-new-tokens needs a value"),
    (["--requests", "x"], "--requests takes '-'"),
    (["--chat"], "--chat applies to --prompt text"),
], ids=["unknown", "no-value", "requests-not-dash", "chat-with-ids"])
def test_other_command_line_errors_say_the_fix(native, tiny_llama_pte, args, words):  # noqa: F811
    code, out, err = run_cli(native, "--bundle", tiny_llama_pte, "--prompt-ids", "5,6", *args)
    refused(code, err, words)
    assert out == "" and "usage:" not in err


# ---- 3. hand-edited manifests ---------------------------------------------------------------------------------------
def add_table(shape, dtype="float32", rows=None):
    """An embed_table beside the program (an executorch bundle has none; the check is format-neutral): a file of
    vocab x hidden float32 zeros, listed with its checksum, recorded with `shape`."""
    def change(d, folder):
        data = bytes(4 * (rows or d["vocab_size"]) * d["hidden_size"])
        (folder / "embed_table.bin").write_bytes(data)
        d["files"]["embed_table.bin"] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
        d["tables"]["embed_table"] = {"file": "embed_table.bin", "dtype": dtype,
                                      "shape": shape(d) if callable(shape) else shape}
    return change


def cache(field, value):
    return lambda d, _: d["kv"]["layout"]["caches"][0].update({field: value})


EDITS = {
    "eos-not-a-list": (lambda d, _: d["tokenizer"].update(eos_token_ids="abc"),
                       'tokenizer.eos_token_ids is "abc", not a list of token ids'),
    "eos-outside-vocab": (lambda d, _: d["tokenizer"].update(eos_token_ids=[10**7]), "tokenizer.eos_token_ids[0]"),
    "eos-a-float": (lambda d, _: d["tokenizer"].update(eos_token_ids=[2.5]), "tokenizer.eos_token_ids[0]"),
    "bos-a-string": (lambda d, _: d["tokenizer"].update(bos_token_id="x"), "tokenizer.bos_token_id"),
    "vocab-a-string": (lambda d, _: d.update(vocab_size="big"), 'vocab_size is "big"'),
    "vocab-past-int32": (lambda d, _: d.update(vocab_size=10**12), "vocab_size is 1000000000000"),
    "negative-draft-len": (lambda d, _: d.update(max_draft_len=-1), "max_draft_len is -1"),
    "embed-scale": (lambda d, _: d.update(embed_scale=-1), "embed_scale"),
    "context-mismatch": (lambda d, _: d.update(max_context=d["max_context"] + 1), "differs from max_context"),
    "slots-past-context": (cache("slots", 10**6), "more than max_context"),
    "heads-a-float": (cache("num_kv_heads", 2.5), "kv.layout.caches[0].num_kv_heads"),
    "window-zero": (cache("window", 0), "kv.layout.caches[0].window"),
    "kind-unknown": (cache("kind", "global"), "kv.layout.caches[0].kind"),
    "cache-shape": (cache("shape", [1, 2, 999, 16]), "kv.layout.caches[0].shape"),
    "graph-dim-huge": (lambda d, _: d["graphs"]["target"]["outputs"][0]["shape"].__setitem__(2, 1e30),
                       "graphs.target.outputs[0].shape[2]"),
    "file-bytes-negative": (lambda d, _: next(iter(d["files"].values())).update(bytes=-1), ".bytes is -1"),
    "table-shape": (add_table([7, 3]), "tables.embed_table is float32[7, 3] (84 bytes), but embed_table.bin holds"),
    "table-rows-for-cols": (add_table(lambda d: [d["hidden_size"], d["vocab_size"]]),
                            "not [vocab_size, hidden_size]"),
    "table-dtype": (add_table(lambda d: [d["vocab_size"], d["hidden_size"]], dtype="complex128"),
                    "tables.embed_table needs a dtype"),
}


@pytest.mark.parametrize("case", list(EDITS))
def test_hand_edited_manifest_fields_are_refused(native, copy, case):  # noqa: F811
    change, words = EDITS[case]
    edit_manifest(copy, change)
    before = snapshot(copy)
    code, out, err = generate(native, copy)
    refused(code, err, f"{copy / MANIFEST}: ", words, "manifest.json was edited or damaged")
    assert out == "" and snapshot(copy) == before


def test_a_well_formed_extra_table_is_taken(native, copy):  # noqa: F811
    """The table checks refuse what is wrong, not what is unusual: a correct [vocab, hidden] float32 table runs."""
    edit_manifest(copy, add_table(lambda d: [d["vocab_size"], d["hidden_size"]]))
    code, out, err = generate(native, copy, "--no-spec")
    assert code == 0 and len(json.loads(out)["tokens"]) == 2, err


def huge_context(d, _):
    """max_context and every cache's slots (and recorded shape) at 2^31 - 1: a consistent manifest whose KV cache
    (about 1.5 TiB for the tiny llama) no machine here has."""
    d["max_context"] = d["kv"]["layout"]["max_context"] = INT32_MAX
    for c in d["kv"]["layout"]["caches"]:
        c["slots"] = c["shape"][2] = INT32_MAX


def test_a_kv_cache_past_the_machines_memory_is_refused_before_allocating(native, copy):  # noqa: F811
    edit_manifest(copy, huge_context)
    code, out, err = generate(native, copy)
    refused(code, err, f"max_context {INT32_MAX} needs a KV cache of", "GiB", "more than this machine's",
            "--max-context")
    assert out == "" and "bad_alloc" not in err


# ---- 4. --requests -: a junk line is answered, the loop goes on; an empty input is an error -------------------------
def test_a_junk_request_line_is_answered_and_the_next_one_served(native, tiny_llama_pte):  # noqa: F811
    lines = ["this is not a request", "--prompt-ids 5,6 --max-new-tokens 2", "", '{"prompt_ids": [5, 6]}',
             "--prompt-ids 5,6 --max-new-tokens 99999999999", "--prompt-ids 5,6 --max-new-tokens 3 --no-spec"]
    code, out, err = run_cli(native, "--bundle", tiny_llama_pte, "--requests", "-", stdin="\n".join(lines) + "\n")
    assert code == 0, err
    header, *answers = [json.loads(line) for line in out.splitlines()]
    assert header["runtime"] == "native-executorch"
    assert [a.get("line") for a in answers] == [1, None, 4, 5, None]
    for bad in (answers[0], answers[2], answers[3]):
        assert "\n  fix: " in bad["error"], bad
    assert "unknown option 'this'" in answers[0]["error"]
    assert "--max-new-tokens expects an integer in [1, 2147483647], got '99999999999'" in answers[3]["error"]
    assert len(answers[1]["tokens"]) == 2 and len(answers[4]["tokens"]) == 3


@pytest.mark.parametrize("stdin,words", [("", "empty input"), ("\n  \n\n", "only blank lines")],
                         ids=["empty", "blank-lines"])
def test_an_empty_requests_input_is_an_error_with_a_fix(native, tiny_llama_pte, stdin, words):  # noqa: F811
    code, out, err = run_cli(native, "--bundle", tiny_llama_pte, "--requests", "-", stdin=stdin)
    refused(code, err, "--requests -: stdin ended without a request", words, "fix: send one request per line")
    assert len(out.splitlines()) == 1 and "host_check" in json.loads(out)  # the header, as a driver expects it


# ---- 5. the bundle path -------------------------------------------------------------------------------------------
def test_a_bundle_path_that_is_a_file_says_so(native, tiny_llama_pte, tmp_path):  # noqa: F811
    (tmp_path / "f").write_text("x")
    code, out, err = run_cli(native, "--bundle", tmp_path / "f", "--prompt-ids", "5")
    refused(code, err, f"{tmp_path / 'f'} is a file, not a bundle folder")
    assert "does not exist" not in err and out == ""
    code, _, err = run_cli(native, "--bundle", Path(tiny_llama_pte) / MANIFEST, "--prompt-ids", "5")
    refused(code, err, "is a file, not a bundle folder",
            f"fix: pass the folder that holds it: --bundle {tiny_llama_pte}")
    code, _, err = run_cli(native, "--bundle", tmp_path / "missing", "--prompt-ids", "5")
    refused(code, err, "does not exist")
