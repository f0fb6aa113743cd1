"""Quieting the libraries' own loggers around work whose warnings are not the user's business (tracing, imports)."""

from __future__ import annotations

import contextlib
import logging

# torchao's CUDA-only extensions fail to load on CPU builds, and torch's pytree warns about torchao's enums: both
# warnings on every import of torchao (and of the packages that import it), neither actionable by a user
IMPORT_NOISE = ("torchao", "torch.utils._pytree")


@contextlib.contextmanager
def quiet(*names: str, level: int = logging.ERROR):
    """Raise the given loggers to `level` for the duration of the block."""
    loggers = [logging.getLogger(name) for name in names]
    before = [log.level for log in loggers]
    for log in loggers:
        log.setLevel(level)
    try:
        yield
    finally:
        for log, old in zip(loggers, before):
            log.setLevel(old)
