"""Quieting the libraries' own loggers around work whose warnings are not the user's business (tracing, imports)."""

from __future__ import annotations

import contextlib
import logging

# torchao's CUDA-only extensions fail to load on CPU builds, and torch's pytree warns about torchao's enums: both
# warnings on every `import executorch` / `import torchao`, neither actionable by a user
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


def import_coremltools():
    """coremltools, imported without its import-time warnings (an untested torch version, no Core ML framework off
    macOS: neither is the user's business), or a ConfigError saying what to install."""
    import warnings

    from edge_spec.errors import ConfigError

    try:
        with quiet("coremltools", *IMPORT_NOISE), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import coremltools
    except ImportError as err:
        raise ConfigError(f"the coreml format needs coremltools ({err.name or err})", "pip install coremltools==9.0") from err
    return coremltools
