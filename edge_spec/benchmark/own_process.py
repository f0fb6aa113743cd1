"""Our runtime's peak resident memory, measured as a peer's is: a decode in a process of its own.

`edge-spec bench` runs every configuration, the peers' pipes and its own modules (tqdm, the plot's matplotlib) in one
process, whose peak is not what a user's decode needs. So after measuring, bench decodes every prompt once more in a
spawned child (edge_spec.peers.isolated, as the peers run): the engine loaded as bench loaded it, the speculative
configuration with the largest k (adaptive when benched: the drafter loaded and drafting, its most rows per pass),
and takes that child's peak (VmHWM). Costs one more speculative pass over the prompts.
"""

from __future__ import annotations

from edge_spec.peers.isolated import IsolatedPeer


class RowDecode:
    """Built in the child: `load(**load_kwargs)`; `run` decodes one prompt ({"prompt", "chat"}) as bench's
    speculative runs do."""

    def __init__(self, load_kwargs: dict, *, k: int, adaptive: bool, temperature: float, lookup: bool,
                 datastore: bool):
        from edge_spec.api import load

        self.engine = load(**load_kwargs)
        if not datastore:
            self.engine.datastore = None
        self.options = dict(temperature=temperature, speculative=True, spec_k=k, adaptive=adaptive, lookup=lookup,
                            allow_inexact=True)

    def warm_up(self, prompt: dict) -> None:
        self.run(prompt, 8)

    def run(self, prompt: dict, max_new_tokens: int) -> None:
        self.engine.generate(prompt["prompt"], chat=prompt["chat"], max_new_tokens=max_new_tokens, seed=0,
                             **self.options)

    def result(self) -> dict:
        return {}


def decode_peak_mb(load_kwargs: dict, prompts: list[dict], *, k: int, adaptive: bool, temperature: float,
                   max_new_tokens: int, lookup: bool = True, datastore: bool = True) -> float:
    """The peak resident memory (MB) of a child process that loads the engine and decodes every prompt."""
    child = IsolatedPeer(RowDecode, load_kwargs, k=k, adaptive=adaptive, temperature=temperature, lookup=lookup,
                         datastore=datastore)
    try:
        child.warm_up(prompts[0])
        for prompt in prompts:
            child.run(prompt, max_new_tokens)
        return child.result()["peak_rss_mb"]
    finally:
        child.close()
