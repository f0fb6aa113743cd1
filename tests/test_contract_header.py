"""The C++ runner's contract names come from the Python table (fast tier): runtimes/native/src/contract_names.h is
what runtimes/native/scripts/gen_contract_header.py writes from edge_spec/contract/kv.py and formats.py, and no other
C++ source of the runner spells a contract name (an IO name, a name prefix, a symbolic dim, a KV binding, a format) as
a string literal."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NATIVE = ROOT / "runtimes" / "native"
SCRIPT = NATIVE / "scripts" / "gen_contract_header.py"
HEADER = NATIVE / "src" / "contract_names.h"
# every C++ / Objective-C++ / C source the runner is built from (its tests read the names from the shared vectors or
# take them on the command line)
SOURCES = sorted(p for folder in (NATIVE / "src", NATIVE / "include", NATIVE / "tokenizer")
                 for p in folder.rglob("*") if p.suffix in {".cpp", ".h", ".mm", ".c", ".inc"} and p != HEADER)
# the same spelling meaning something else: (file, literal) -> why
NOT_THE_CONTRACT = {
    ("src/coreml_model.mm", "coreml"): "the compiled-model cache folder, as runtimes/coreml.py names it",
}
# A C/C++ string literal (no raw strings in these sources), and comments to drop before looking for them.
LITERAL = re.compile(r'"((?:[^"\\\n]|\\.)*)"')
COMMENT = re.compile(r'//[^\n]*|/\*.*?\*/', re.S)


def generator():
    spec = importlib.util.spec_from_file_location("gen_contract_header", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_header_is_what_the_generator_writes():
    assert HEADER.read_text() == generator().render(), (
        f"{HEADER.relative_to(ROOT)} is out of date: run .venv/bin/python {SCRIPT.relative_to(ROOT)}")


def test_the_header_carries_every_contract_name_and_format():
    from edge_spec.contract import formats, kv

    text = HEADER.read_text()
    for name in generator().names():
        assert f'"{name}"' in text, name
    for name, row in formats.FORMATS.items():
        assert f'FORMAT_{name.upper()} = "{name}"' in text
        line = next(line for line in text.splitlines() if line.strip().startswith(f"{{FORMAT_{name.upper()},"))
        flags = [f.strip() for f in line.rsplit("}", 2)[-2].split(",")[1:]]  # constant_tables, native, eagle3_state
        assert flags == [str(row.constant_tables).lower(), str(row.native).lower(), str(row.eagle3_state).lower()]
    assert f"TABLE_BLOCK = {kv.TABLE_BLOCK};" in text and f"SHARED_SPARE_SLOTS = {kv.SHARED_SPARE_SLOTS};" in text


def strip_comments(text: str) -> str:
    """The source without its comments (a comment may name a contract name in prose; a "//" inside a string literal
    does not occur in these sources' contract lines, and a literal cut short there only hides text, never adds)."""
    out, i = [], 0
    for match in re.finditer(r'"(?:[^"\\\n]|\\.)*"|//[^\n]*|/\*.*?\*/', text, re.S):
        out.append(text[i:match.start()])
        out.append(match.group(0) if match.group(0).startswith('"') else " ")
        i = match.end()
    return "".join(out) + text[i:]


def test_no_cpp_source_spells_a_contract_name():
    from edge_spec.contract import formats

    names = set(generator().names()) | set(formats.FORMATS)
    names.discard("qnn")  # also the QNN execution provider's name and the bundle's qnn/ folder: not the format
    found = []
    for path in SOURCES:
        code = strip_comments(path.read_text(errors="replace"))
        for match in LITERAL.finditer(code):
            if match.group(1) in names and (str(path.relative_to(NATIVE)), match.group(1)) not in NOT_THE_CONTRACT:
                line = code.count("\n", 0, match.start()) + 1
                found.append(f"{path.relative_to(ROOT)}:{line}: \"{match.group(1)}\"")
    assert not found, ("contract names spelled in C++ (use contract_names.h: contract::INPUT_IDS, "
                       "contract::k_cache_name(layer), ...):\n" + "\n".join(found))


def test_the_check_finds_a_spelled_name(tmp_path):
    """Negative control: the literal scan sees a name in code, not in a comment."""
    code = strip_comments('// "input_ids" in prose\nin.emplace("input_ids", x);  /* "logits" */\n')
    assert [m.group(1) for m in LITERAL.finditer(code)] == ["input_ids"]
