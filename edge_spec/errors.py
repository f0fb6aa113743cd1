"""Every error edge-spec raises on purpose: one base class, each message ends with the fix.

The CLI catches `EdgeSpecError`, prints `error: <message>` and exits non-zero without a traceback.
"""

from __future__ import annotations


class EdgeSpecError(RuntimeError):
    """Base class: a problem the user can fix. `str(err)` says what is wrong and what to do."""

    def __init__(self, what: str, fix: str | None = None):
        self.what = what
        self.fix = fix
        super().__init__(what if fix is None else f"{what}\n  fix: {fix}")


class CheckpointError(EdgeSpecError):
    """A model folder / file is missing, corrupt, or of a family we do not support."""


class ConfigError(EdgeSpecError):
    """Bad argument values (sampling parameters, draft length, ...)."""


class ContextOverflowError(EdgeSpecError):
    """The prompt plus requested tokens do not fit the context the KV cache was sized for."""


class KVStateError(EdgeSpecError):
    """An operation on the KV state that would give wrong logits (e.g. rewinding across an eviction)."""


class BundleError(EdgeSpecError):
    """An exported bundle is corrupt, truncated, or does not match what it claims."""


class ExportError(EdgeSpecError):
    """An exporter could not turn a model into an artifact that honours the KV contract."""
