"""A portable random number generator: the same uniforms in Python and in the native runner (runtimes/native,
src/sampling.h PortableRng), so a seeded run samples the same tokens in both.

SplitMix64 (Steele, Lea, Flood 2014): integer arithmetic mod 2^64, uniforms (x >> 11) * 2^-53 in [0, 1). The sampling
loops need only `.random()` (edge_spec.decoding.sampling.sample, edge_spec.decoding.speculative.verify), so an instance can stand in for
numpy's Generator there: `generate_plain(..., rng=PortableRng(seed))`. Nothing uses it by default (the Python
runtime's seeded runs keep numpy's generator).
"""

from __future__ import annotations

_MASK = (1 << 64) - 1


class PortableRng:
    def __init__(self, seed: int = 0):
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
        self.state = seed & _MASK

    def next_u64(self) -> int:
        self.state = (self.state + 0x9E3779B97F4A7C15) & _MASK
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
        return z ^ (z >> 31)

    def random(self) -> float:
        """A uniform float in [0, 1) (53 random bits)."""
        return (self.next_u64() >> 11) * (1.0 / (1 << 53))
