"""The import layers ([tool.importlinter] in pyproject.toml) hold on the package as it is installed.

import-linter's graph builder (grimp) walks a package's folder, and exporters/, runtimes/ and peers/ join edge_spec only
through pyproject's package-dir, so `lint-imports` run on the checkout would not see them (it stops at "Missing layer"
rather than pass). Here the installed tree is laid out as symlinks in a temp folder and import-linter runs on it in a
fresh interpreter, where `edge_spec` resolves to that tree. Imports inside functions count: grimp reads them all.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = ROOT / "pyproject.toml"
LINT = "from importlinter.cli import lint_imports_command; lint_imports_command()"


def installed_tree(dest: Path) -> Path:
    """edge_spec as pip installs it (package-dir), under `dest`: a real folder per package of package-dir, holding
    symlinks to its files and subfolders (a test may add a module to such a folder; the checkout stays untouched)."""
    package_dir = tomllib.loads(PYPROJECT.read_text())["tool"]["setuptools"]["package-dir"]
    for package in sorted(package_dir, key=lambda name: name.count(".")):  # edge_spec before edge_spec.exporters
        target = dest.joinpath(*package.split("."))
        assert not target.is_symlink(), f"{package} is both a folder of its parent and mapped in package-dir"
        target.mkdir(parents=True)
        for entry in (ROOT / package_dir[package]).iterdir():
            if entry.name != "__pycache__":
                (target / entry.name).symlink_to(entry)
    return dest


def lint(tree: Path) -> subprocess.CompletedProcess:
    """import-linter on `tree` with this checkout's contracts, in a fresh interpreter (-P: not the current folder)."""
    path = os.pathsep.join(filter(None, [str(tree), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path, "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-P", "-c", LINT, str(PYPROJECT), "--no-cache", "--no-logo"],
                          cwd=tree, env=env, capture_output=True, text=True, timeout=120)


def test_layers_and_no_cycles(tmp_path):
    """Every contract in pyproject.toml is kept (a broken one prints the import chain that breaks it)."""
    result = lint(installed_tree(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_an_upward_import_is_caught(tmp_path):
    """Negative control: a runtime (a mapped package) importing the CLI inside a function breaks the layers."""
    tree = installed_tree(tmp_path)
    (tree / "edge_spec" / "runtimes" / "zz_upward.py").write_text(
        "def probe():\n    from edge_spec.cli import main\n\n    return main\n")
    result = lint(tree)
    assert result.returncode != 0, result.stdout + result.stderr
    assert "edge_spec.runtimes is not allowed to import edge_spec.cli" in result.stdout, result.stdout + result.stderr
    assert "edge_spec.runtimes.zz_upward -> edge_spec.cli" in result.stdout, result.stdout
