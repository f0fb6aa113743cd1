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


NOTICES = "edge_spec"  # the logger whose warnings are notices to the user (a capped --threads, ...)


class _Stderr(logging.Handler):
    """Writes each record's message to the current sys.stderr (looked up per record, so redirections apply)."""

    def emit(self, record: logging.LogRecord) -> None:
        import sys

        print(record.getMessage(), file=sys.stderr)


def show_notices() -> None:
    """The CLI: print edge-spec's notices on stderr as they are (`notice: ...`), once however often it is called.
    A program using the Python API sees them through its own logging setup (or Python's last-resort handler)."""
    log = logging.getLogger(NOTICES)
    if not any(isinstance(h, _Stderr) for h in log.handlers):
        log.addHandler(_Stderr(logging.WARNING))
