"""Skipping a test for a missing build tool, except in CI.

On a developer's machine a test whose tool is missing (cmake, a JDK, npm, clang) skips and says how to install it.
In CI (`CI` set, as `.ci/run` sets it) the same test fails: a CI run must not pass with the native runner and the
Android bridge untested because a package was absent.
"""

import os

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() not in ("", "0", "false", "no")


def skip_or_fail(reason: str) -> None:
    """pytest.skip(reason) on a developer's machine; pytest.fail in CI (the prerequisite is part of the run)."""
    if in_ci():
        pytest.fail(f"CI lacks a prerequisite: {reason}", pytrace=False)
    pytest.skip(reason)
