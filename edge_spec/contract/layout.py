"""A model's KV layout: which layers keep a cache and how many slots each holds (edge_spec.contract.kv's types, sized
from a ModelConfig). Every runtime, exporter and the bundle builder take their layout from here.
"""

from __future__ import annotations

from edge_spec.contract.kv import BINDING_STATE, CacheSpec, KVLayout, ring_slots
from edge_spec.errors import ConfigError
from edge_spec.model.config import SLIDING, ModelConfig


def kv_layout(cfg: ModelConfig, max_context: int, max_pass: int | None = None, binding: str = "io",
              fixed_shapes: bool = False) -> KVLayout:
    """The cache layout of `cfg` for a given max context (full layers: max_context slots; rings: `kv.ring_slots`).

    `max_pass` caps the tokens of one forward. `io` binding: it only matters with sliding layers (their rings grow
    to W + max_pass - 1 slots) and is dropped for full-attention-only models, whose graphs take any T. `state`
    binding: always kept (the program's buffers are planned for it; rings of W + max_pass); so with `fixed_shapes`
    (fixed-shape formats: the largest fixed pass length)."""
    if isinstance(max_context, bool) or not isinstance(max_context, int) or max_context < 1:
        raise ConfigError(f"max_context must be an integer >= 1, got {max_context!r}")
    if max_context > cfg.max_position_embeddings:
        raise ConfigError(f"max_context {max_context} exceeds the model's max_position_embeddings "
                          f"{cfg.max_position_embeddings}", f"use --max-context {cfg.max_position_embeddings} or less")
    caches = []
    for layer in cfg.cached_layers():
        kind = cfg.layer_kinds[layer]
        window = cfg.sliding_window if kind == SLIDING else None
        slots = ring_slots(window, max_context, max_pass, binding) if window else max_context
        caches.append(CacheSpec(layer, kind, cfg.kv_heads[layer], cfg.head_dims[layer], slots, window))
    keep_cap = binding == BINDING_STATE or fixed_shapes or any(c.window for c in caches)
    return KVLayout(tuple(caches), max_context, max_pass if keep_cap else None, binding)
