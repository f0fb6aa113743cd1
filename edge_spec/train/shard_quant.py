"""4-bit storage of teacher activations with a Hadamard rotation (`train-drafter --shard-bits 4`).

Teacher hidden states and K/V rows have outlier channels. Rotating each group of G values by the
orthonormal Hadamard matrix H_G / sqrt(G) spreads an outlier over the whole group, so one absmax scale per
group wastes fewer of the 15 int4 levels. Per row, the last axis is cut into groups of G = 64 (SmolLM2's
head dim; its hidden size 576 = 9 x 64); each rotated group is stored as int4 codes in [-7, 7] (two per byte)
plus one fp16 scale: 4 + 16/64 = 4.25 bits per value instead of fp16's 16 (3.76x smaller).
Decoding undoes the rotation exactly (H is symmetric and orthonormal, so H^-1 = H).
"""

from __future__ import annotations

import numpy as np

GROUP = 64
LEVELS = 7  # codes -7 .. 7 (stored + 8 as a nibble)
ENCODED = ("hidden", "k_", "v_")  # npz members stored in 4 bits (tokens stay exact)


def hadamard(n: int) -> np.ndarray:
    """[n, n] orthonormal Hadamard matrix (Sylvester), n a power of two."""
    if n < 1 or n & (n - 1):
        raise ValueError(f"Hadamard size must be a power of two, got {n}")
    h = np.ones((1, 1), dtype=np.float32)
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h / np.sqrt(n, dtype=np.float32)


def pick_group(d: int) -> int:
    """GROUP, or the largest power of two dividing d when GROUP does not (tiny test models)."""
    return GROUP if d % GROUP == 0 else d & -d


def _groups(x: np.ndarray, group: int) -> np.ndarray:
    if x.shape[-1] % group:
        raise ValueError(f"last axis {x.shape[-1]} is not a multiple of the group size {group}")
    return x.reshape(*x.shape[:-1], x.shape[-1] // group, group)


def encode(x: np.ndarray, group: int | None = None, rotate: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """x: [..., D] float -> (codes uint8 [..., D/2], scales float16 [..., D/group]); group defaults to pick_group(D)."""
    group = group or pick_group(x.shape[-1])
    g = _groups(np.asarray(x, dtype=np.float32), group)  # [..., D/G, G]
    if rotate:
        g = g @ hadamard(group)
    scale = np.abs(g).max(axis=-1) / LEVELS  # [..., D/G]
    scale16 = scale.astype(np.float16)
    safe = np.where(scale16 > 0, scale16.astype(np.float32), 1.0)[..., None]
    q = np.clip(np.rint(g / safe), -LEVELS, LEVELS).astype(np.int8) + 8  # [..., D/G, G] in 1 .. 15
    q = q.reshape(*x.shape[:-1], x.shape[-1]).astype(np.uint8)
    return (q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8), scale16


def decode(codes: np.ndarray, scales: np.ndarray, rotate: bool = True) -> np.ndarray:
    """Inverse of `encode` (the group size follows from the shapes): -> float32 [..., D]."""
    d = codes.shape[-1] * 2
    group = d // scales.shape[-1]
    q = np.empty((*codes.shape[:-1], d), dtype=np.int8)
    q[..., 0::2] = (codes & 0x0F).astype(np.int8) - 8
    q[..., 1::2] = (codes >> 4).astype(np.int8) - 8
    g = _groups(q.astype(np.float32), group) * scales.astype(np.float32)[..., None]
    if rotate:
        g = g @ hadamard(group)  # H^-1 = H
    return g.reshape(*codes.shape[:-1], d)


def encode_arrays(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Shard members -> the same members, activations replaced by `<name>.codes` + `<name>.scales`."""
    out = {}
    for name, a in arrays.items():
        if name.startswith(ENCODED):
            out[f"{name}.codes"], out[f"{name}.scales"] = encode(a)
        else:
            out[name] = a
    return out


def decode_arrays(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Inverse of `encode_arrays` (members that were not encoded pass through)."""
    out = {}
    for name, a in arrays.items():
        if name.endswith(".codes"):
            base = name[:-len(".codes")]
            out[base] = decode(a, arrays[f"{base}.scales"])
        elif not name.endswith(".scales"):
            out[name] = a
    return out
