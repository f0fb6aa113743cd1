"""The long tier's variant exports: what `make test` leaves to `make test-real` besides real models.

CI's fast tier must stay inside its 25 minutes on 2 cores, and a tiny ExecuTorch or Core ML export costs 40-100 s
there. So the fast tier exports each format's default forms (every claim of tests/test_contract.py on its default
rows, each format's own files and options), and a *variant* - a second precision, KV binding, drafter or model family
of a format whose default form the fast tier already exports - runs in `make test-real` with the real models. A
variant is named where it is defined, with `long_variant` (a fixture or parametrize param) or `LONG` (a test, a
tests/contract.Row with `long=True`), never by a test's run time alone.
"""

import pytest

LONG = pytest.mark.real  # the long tier's marker (`make test-real` runs `-m real`)


def long_variant(value, id: str | None = None):
    """A param (of a fixture or of parametrize) that exports a variant: it runs in the long tier only."""
    return pytest.param(value, id=id if id is not None else str(value), marks=LONG)
