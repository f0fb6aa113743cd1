"""edge-spec: lossless speculative decoding for on-device LLMs.

    import edge_spec
    engine = edge_spec.load("smollm2-135m")
    print(engine.generate("The capital of France is", max_new_tokens=16).text)
"""

from __future__ import annotations

from edge_spec.version import __version__


def load(model: str = "smollm2-135m", **kwargs):
    """See edge_spec.api.load (imported lazily so `import edge_spec` stays cheap)."""
    from edge_spec.api import load as _load

    return _load(model, **kwargs)


__all__ = ["load", "__version__"]
