"""Bad input to the CLI and the Python API (the native runner's: tests/test_native_hardening.py): each case gets a
clear `error:` with a `fix:` line and exit code 2 (the API: an EdgeSpecError), never a traceback, and leaves every
file on disk as it was. The cases are the ones a bad-input sweep found (issue 43): an export that deleted files,
10,000 threads, tracebacks on a negative seed, an unwritable --out or a closed pipe, token ids that wrapped, and
hand-edited manifests.
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import edge_spec
from edge_spec.cli import main
from edge_spec.contract.atomic import write_bundle
from edge_spec.contract.manifest import MANIFEST, read_manifest
from edge_spec.errors import BundleError, ConfigError, ExportError


@pytest.fixture(scope="module")
def bundle(tiny_bundles):
    """The tiny llama ONNX bundle with its drafter (tests/contract.py), shared: tests copy it before damaging it."""
    return tiny_bundles.get("onnx", "llama")[0]


@pytest.fixture()
def copy(bundle, tmp_path):
    dst = tmp_path / "bundle"
    shutil.copytree(bundle, dst)
    return dst


def snapshot(folder: Path) -> dict:
    """Every file under `folder` -> sha256 (what 'nothing on disk changed' compares)."""
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def cli(capsys, *args):
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def refused(code, err, *words):
    assert code == 2, err
    assert "error:" in err and "fix:" in err and "Traceback" not in err, err
    for w in words:
        assert w in err, err


# ---- 1. exports replace only a bundle, and only its own files ----------------------------------------------------
@pytest.mark.parametrize("manifest", ["{}", "not json", json.dumps({"schema_version": 2, "files": {}})])
def test_export_never_replaces_a_folder_whose_manifest_is_not_a_bundles(bundle, tmp_path, capsys, manifest):
    out = tmp_path / "mine"
    out.mkdir()
    (out / MANIFEST).write_text(manifest)
    (out / "thesis.tex").write_text("three years of work")
    before = snapshot(out)
    code, _, err = cli(capsys, "export", "--model", "no-such-model-is-loaded", "--out", str(out))
    refused(code, err, "refusing to replace")
    assert snapshot(out) == before
    with pytest.raises(ExportError, match="refusing to replace"):  # the write itself, as an exporter calls it
        write_bundle(out, fake_build(read_manifest(bundle, verify_checksums=False)))
    assert snapshot(out) == before


def edit_manifest(folder: Path, change) -> None:
    data = json.loads((folder / MANIFEST).read_text())
    change(data)
    (folder / MANIFEST).write_text(json.dumps(data))


def fake_build(manifest):
    """A `write_bundle` build step that writes one file and returns an existing bundle's manifest."""
    def build(tmp: Path):
        (tmp / "new.bin").write_bytes(b"new")
        return manifest
    return build


def test_a_bundle_with_files_it_does_not_list_is_refused_and_kept(copy, capsys):
    (copy / "notes.txt").write_text("mine")
    before = snapshot(copy)
    code, _, err = cli(capsys, "export", "--model", "no-such-model-is-loaded", "--out", str(copy))
    refused(code, err, "notes.txt", "does not list")
    assert snapshot(copy) == before
    with pytest.raises(ExportError, match="notes.txt"):  # the write itself checks too
        write_bundle(copy, fake_build(read_manifest(copy, verify_checksums=False)))
    assert snapshot(copy) == before


def test_a_bundle_is_replaced_whole_and_a_failed_build_leaves_it(copy):
    manifest = read_manifest(copy)
    before = snapshot(copy)

    def broken(tmp: Path):
        (tmp / "half.bin").write_bytes(b"half")
        raise OSError(28, "No space left on device")

    with pytest.raises(ExportError, match="unchanged"):
        write_bundle(copy, broken)
    assert snapshot(copy) == before and not list(copy.parent.glob(".bundle.*"))
    write_bundle(copy, fake_build(manifest))
    assert set(snapshot(copy)) == {"new.bin", MANIFEST}


@pytest.mark.parametrize("where", ["under-a-file", "proc"])
def test_export_under_an_unwritable_place_is_refused(tmp_path, capsys, where):
    (tmp_path / "file").write_text("x")
    out = tmp_path / "file" / "bundle" if where == "under-a-file" else Path("/proc/edge-spec-test/bundle")
    code, _, err = cli(capsys, "export", "--model", "no-such-model-is-loaded", "--out", str(out))
    refused(code, err, "--out")
    assert (tmp_path / "file").read_text() == "x"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_export_under_a_read_only_folder_is_refused(tmp_path, capsys):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        code, _, err = cli(capsys, "export", "--model", "no-such-model-is-loaded", "--out", str(ro / "b"))
        refused(code, err, "cannot write")
    finally:
        ro.chmod(0o755)


# ---- 2. threads ---------------------------------------------------------------------------------------------------
def test_more_threads_than_cores_are_capped_with_a_notice(bundle, capsys):
    code, out, err = cli(capsys, "generate", "--bundle", str(bundle), "--prompt", "w5 w6", "--max-new-tokens", "3",
                         "--threads", "10000", "--no-spec")
    assert code == 0 and f"--threads 10000 is more than this machine's {os.cpu_count()} cores" in err, err


@pytest.mark.parametrize("threads", ["0", "-3"])
def test_threads_below_one_are_refused(bundle, capsys, threads):
    code, _, err = cli(capsys, "generate", "--bundle", str(bundle), "--prompt", "w5", "--threads", threads)
    refused(code, err, "threads must be an integer >= 1")


# ---- 3. tracebacks ------------------------------------------------------------------------------------------------
def test_a_negative_seed_is_refused_before_loading(capsys):
    code, _, err = cli(capsys, "generate", "--model", "no-such-model-is-loaded", "--prompt", "hi", "--seed", "-5")
    refused(code, err, "seed must be an integer >= 0")


def test_a_closed_pipe_ends_generate_quietly(bundle):
    """`edge-spec generate ... | head -c1`: the reader leaves after one byte; no traceback, no process left."""
    cmd = [sys.executable, "-m", "edge_spec.cli", "generate", "--bundle", str(bundle), "--prompt", "w5 w6",
           "--max-new-tokens", "40", "--no-spec", "--threads", "1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.read(1)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    code = proc.wait(timeout=120)
    assert "Traceback" not in err and "BrokenPipe" not in err, err
    assert code in (0, 141), (code, err)


# ---- 4. token ids through the Python API --------------------------------------------------------------------------
@pytest.mark.parametrize("ids", [[1, -7, 5], [1, 10**6], [1, 2.0], [True, 3]], ids=["negative", "too-big", "float", "bool"])
def test_bad_token_ids_are_refused(bundle, ids):
    engine = edge_spec.load(bundle=bundle, threads=1, host_check=False)
    with pytest.raises(ConfigError, match="not a token id of this model"):
        engine.generate(ids, max_new_tokens=2)


def test_a_prompt_of_another_type_and_a_bad_seed_are_refused(bundle):
    engine = edge_spec.load(bundle=bundle, threads=1, host_check=False)
    with pytest.raises(ConfigError, match="prompt must be text or a list"):
        engine.generate(b"bytes", max_new_tokens=2)
    with pytest.raises(ConfigError, match="seed must be"):
        engine.generate([1, 2], max_new_tokens=2, seed=-1)


# ---- 5. hand-edited manifests -------------------------------------------------------------------------------------
def huge_context(data):
    data["max_context"] = data["kv"]["layout"]["max_context"] = 2**31 - 1
    for c in data["kv"]["layout"]["caches"]:
        c["slots"] = c["shape"][2] = 2**31 - 1


EDITS = {
    "eos-not-a-list": (lambda d: d["tokenizer"].update(eos_token_ids="abc"), "eos_token_ids"),
    "eos-outside-vocab": (lambda d: d["tokenizer"].update(eos_token_ids=[10**7]), "eos_token_ids[0]"),
    "vocab-a-string": (lambda d: d.update(vocab_size="big"), "vocab_size"),
    "negative-draft-len": (lambda d: d.update(max_draft_len=-1), "max_draft_len"),
    "context-mismatch": (lambda d: d.update(max_context=d["max_context"] + 1), "differs from max_context"),
    "table-shape": (lambda d: d["tables"]["embed_table"].update(shape=[7, 3]), "tables.embed_table"),
    "table-dtype": (lambda d: d["tables"]["embed_table"].update(dtype="complex128"), "tables.embed_table"),
    "slots-past-context": (lambda d: d["kv"]["layout"]["caches"][0].update(slots=10**6), "slots"),
}


@pytest.mark.parametrize("case", list(EDITS))
def test_hand_edited_manifest_fields_are_refused(copy, capsys, case):
    change, words = EDITS[case]
    edit_manifest(copy, change)
    before = snapshot(copy)
    with pytest.raises(BundleError, match="manifest.json"):
        read_manifest(copy)
    code, _, err = cli(capsys, "generate", "--bundle", str(copy), "--prompt", "w5", "--max-new-tokens", "2")
    refused(code, err, words)
    assert snapshot(copy) == before


def test_a_kv_cache_past_the_machines_memory_is_refused_before_allocating(copy, capsys):
    edit_manifest(copy, huge_context)
    code, _, err = cli(capsys, "generate", "--bundle", str(copy), "--prompt", "w5", "--max-new-tokens", "2")
    refused(code, err, "GiB", "--max-context")


def test_a_bundle_path_that_is_a_file_says_so(tmp_path, capsys):
    (tmp_path / "f").write_text("x")
    code, _, err = cli(capsys, "generate", "--bundle", str(tmp_path / "f"), "--prompt", "w5")
    refused(code, err, "is a file, not a bundle folder")
