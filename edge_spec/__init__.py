"""edge-spec: lossless speculative decoding for on-device LLMs.

    import edge_spec
    engine = edge_spec.load("smollm2-135m")
    print(engine.generate("The capital of France is", max_new_tokens=16).text)
"""

from __future__ import annotations

__version__ = "0.1.0"


def load(model: str = "smollm2-135m", **kwargs):
    """See edge_spec.api.load (imported lazily so `import edge_spec` stays cheap)."""
    from edge_spec.api import load as _load

    return _load(model, **kwargs)


__all__ = ["load", "__version__"]
