"""Lossless speculative decoding: draft k -> one target pass over [last, *drafts] -> verify -> commit n + 1.

`verify` is one pure function (Leviathan et al. 2023, Alg. 1; Chen et al. 2023). Greedy decoding is its
one-hot case: temperature 0 makes both distributions one-hot, so a draft is accepted iff it is the
target's argmax and the "residual" sample is exactly the target's argmax.
Temperature/top-k/top-p are applied identically to target and drafter (`sampling.token_probs`).
The clustered drafter head gives probability 0 to every token outside its selected clusters.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, NamedTuple, Sequence

import numpy as np

from edge_spec.contract.backend import DrafterBackend, DraftStep, Session
from edge_spec.errors import ConfigError
from edge_spec.decoding.cost_model import DATASTORE, CostModel
from edge_spec.decoding.datastore import Datastore
from edge_spec.decoding.generate import GenerationResult, check_request, pick_token
from edge_spec.decoding.lookup import PromptLookup
from edge_spec.decoding.sampling import SamplingParams, sample, token_probs


class VerifyResult(NamedTuple):
    accepted: int  # n: drafts kept (a prefix)
    next_token: int  # correction token (on rejection) or bonus token (all accepted)


def verify(draft_tokens: Sequence[int], draft_probs: np.ndarray, target_probs: np.ndarray, rng) -> VerifyResult:
    """draft_probs: [k, V] (what each draft was sampled from); target_probs: [k + 1, V].

    Accept draft i with probability min(1, p(x) / q(x)); on the first rejection sample from
    max(0, p - q) renormalised; if all k are accepted, sample the bonus token from p[k].
    `rng` needs only `.random()` (one uniform per accept test, one per final sample).
    """
    for i, x in enumerate(draft_tokens):
        p, q = target_probs[i, x], draft_probs[i, x]
        if rng.random() < min(1.0, p / q):
            continue
        residual = np.maximum(target_probs[i] - draft_probs[i], 0.0)
        total = residual.sum()
        return VerifyResult(i, sample(residual / total if total > 0 else target_probs[i], rng))
    k = len(draft_tokens)
    return VerifyResult(k, sample(target_probs[k], rng))


def verify_greedy(draft_tokens: Sequence[int], target_argmax: Sequence[int]) -> VerifyResult:
    """`verify` at temperature 0 without building one-hot rows: keep drafts while they are the target's argmax.

    target_argmax: [k + 1] (lowest id on ties, as `token_probs`). Same result as `verify` on one-hot rows.
    """
    for i, x in enumerate(draft_tokens):
        if x != target_argmax[i]:
            return VerifyResult(i, int(target_argmax[i]))
    k = len(draft_tokens)
    return VerifyResult(k, int(target_argmax[k]))


class LazyRows:
    """Target distributions [k + 1, V] computed a row at a time, on first use (`verify` often stops at row 0-1).

    Indexes like the dense array `verify` expects: rows[i] -> [V], rows[i, x] -> float."""

    def __init__(self, logits: np.ndarray, params: SamplingParams):
        self.logits, self.params, self.rows = logits, params, {}

    def __getitem__(self, key):
        i, x = key if isinstance(key, tuple) else (key, None)
        if i not in self.rows:
            self.rows[i] = token_probs(self.logits[i], self.params)
        return self.rows[i] if x is None else self.rows[i][x]


class SparseRows:
    """Drafter distributions over their candidates only (0 elsewhere): [k] x (sorted ids [N], probs [N]).

    Indexes like a dense [k, V] array; a dense row is built only when `verify` needs a residual."""

    def __init__(self, vocab_size: int):
        self.vocab_size, self.ids, self.probs = vocab_size, [], []

    def append(self, ids: np.ndarray, probs: np.ndarray) -> None:
        self.ids.append(ids)
        self.probs.append(probs)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, key):
        i, x = key if isinstance(key, tuple) else (key, None)
        ids, probs = self.ids[i], self.probs[i]
        if x is None:
            row = np.zeros(self.vocab_size)
            row[ids] = probs
            return row
        j = np.searchsorted(ids, x)
        return float(probs[j]) if j < len(ids) and ids[j] == x else 0.0


def accept_all(draft_tokens, draft_probs, target_probs, rng) -> VerifyResult:
    """A *wrong* verifier (negative control for the distribution test): trusts every draft."""
    k = len(draft_tokens)
    return VerifyResult(k, sample(target_probs[k], rng))


def draft_distribution(step: DraftStep, vocab_size: int, params: SamplingParams) -> np.ndarray:
    """The drafter's distribution over the full vocabulary [V]: 0 outside the scored candidates.

    The dense definition; the loop uses its sparse equivalent `sparse_draft_distribution` (tested against it)."""
    logits = np.full(vocab_size, -np.inf)
    logits[step.token_ids] = step.logits
    return token_probs(logits, params)


def sparse_draft_distribution(step: DraftStep, params: SamplingParams) -> tuple[np.ndarray, np.ndarray]:
    """`draft_distribution` restricted to the candidates: (ids sorted ascending [N], probs [N]).

    Sorting by id keeps the dense version's tie rules (argmax, top-k, nucleus order): the tokens outside
    the candidates have probability 0 there and change nothing."""
    order = np.argsort(step.token_ids, kind="stable")
    ids = step.token_ids[order]
    return ids, token_probs(step.logits[order], params)


def greedy_draft(token_ids, logits) -> int:
    """The greedy draft: the argmax over the candidates, lowest id on ties (as the dense one-hot row).
    Works on numpy arrays (runtime steps) and torch tensors (teacher-forced evaluation)."""
    return int(token_ids[logits == logits.max()].min())


def confidence(step: DraftStep, token: int) -> float:
    """The drafter's own (temperature-1) probability of `token` among its candidates."""
    z = step.logits.astype(np.float64)
    z = np.exp(z - z.max())
    return float(z[step.token_ids == token].sum() / z.sum())


# ---- statistics -------------------------------------------------------------------------------------
@dataclass
class SpecStats:
    k_max: int
    target_calls: int = 0  # verify passes after the prefill
    drafter_calls: int = 0
    drafted: np.ndarray = None  # [k_max] drafts proposed at each position
    accepted: np.ndarray = None  # [k_max] drafts accepted at each position
    emitted_by_passes: int = 0
    drafter_s: float = 0.0
    target_s: float = 0.0
    decode_s: float = 0.0
    k_chosen: list[int] = field(default_factory=list)
    lookup_passes: int = 0  # passes whose drafts came from retrieval (PromptLookup) instead of the MTP drafter
    lookup_accepted: int = 0  # drafts accepted in those passes
    datastore_passes: int = 0  # passes whose drafts came from the static datastore
    datastore_accepted: int = 0  # drafts accepted in those passes
    lookup_calls: int = 0  # prompt-lookup proposals asked for (a pass asks at most once per source)
    lookup_s: float = 0.0  # time in those proposals (part of drafter_s)
    datastore_calls: int = 0  # static-datastore proposals asked for
    datastore_s: float = 0.0  # time in those proposals (part of drafter_s)

    def __post_init__(self):
        self.drafted = np.zeros(self.k_max, dtype=np.int64)
        self.accepted = np.zeros(self.k_max, dtype=np.int64)

    @property
    def tau(self) -> float:
        """Mean tokens emitted per target pass (plain decoding: 1)."""
        return self.emitted_by_passes / self.target_calls if self.target_calls else 0.0

    def acceptance_by_position(self) -> list[float | None]:
        """Per draft position j: of the bursts that drafted position j, the fraction whose first j drafts were all
        accepted (cumulative, not conditional on reaching j: tau = 1 + sum at a fixed k)."""
        return [float(a / d) if d else None for a, d in zip(self.accepted, self.drafted)]

    def to_dict(self) -> dict:
        overhead = max(self.decode_s - self.drafter_s - self.target_s, 0.0)
        return {"tau": self.tau, "target_calls": self.target_calls, "drafter_calls": self.drafter_calls,
                "acceptance_by_position": self.acceptance_by_position(),
                "acceptance_rate": float(self.accepted.sum() / self.drafted.sum()) if self.drafted.sum() else None,
                "time_s": {"drafter": self.drafter_s, "target": self.target_s, "overhead": overhead},
                "mean_k": float(np.mean(self.k_chosen)) if self.k_chosen else 0.0,
                "lookup_passes": self.lookup_passes, "lookup_accepted": self.lookup_accepted,
                "datastore_passes": self.datastore_passes, "datastore_accepted": self.datastore_accepted,
                "lookup_calls": self.lookup_calls, "lookup_s": self.lookup_s,
                "datastore_calls": self.datastore_calls, "datastore_s": self.datastore_s}

    def summary(self) -> str:
        acc = " ".join("-" if a is None else f"{a:.2f}" for a in self.acceptance_by_position())
        d = self.to_dict()["time_s"]
        total = max(self.decode_s, 1e-9)
        lookup = f" | lookup passes {self.lookup_passes}" if self.lookup_passes else ""
        lookup += f" | datastore passes {self.datastore_passes}" if self.datastore_passes else ""
        return (f"tau {self.tau:.2f} | target calls {self.target_calls} | drafter calls {self.drafter_calls}{lookup} | "
                f"accept by pos [{acc}] | time drafter {100 * d['drafter'] / total:.0f}% target "
                f"{100 * d['target'] / total:.0f}% overhead {100 * d['overhead'] / total:.0f}%")


# ---- the loop ---------------------------------------------------------------------------------------
def check_spec_args(k: int, min_confidence: float) -> None:
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ConfigError(f"spec_k must be an integer >= 1, got {k!r}", "use --spec-k 4, for example")
    if not 0.0 <= min_confidence < 1.0:
        raise ConfigError(f"min_confidence must be in [0, 1), got {min_confidence!r}", "use --min-confidence 0.3")


def generate_speculative(session: Session, drafter: DrafterBackend | None, prompt_ids: list[int], *, max_new_tokens: int,
                         params: SamplingParams, rng: np.random.Generator, stop_ids: frozenset[int], k: int,
                         vocab_size: int, adaptive: bool = False, min_confidence: float = 0.0,
                         on_token: Callable[[int], None] | None = None, verifier=verify,
                         lookup: "bool | PromptLookup" = False, datastore: Datastore | None = None) -> GenerationResult:
    """Speculative generation. `lookup`: retrieval drafting first (True: edge_spec.decoding.lookup.PromptLookup over prompt +
    output; or any object with its `extend` / `propose`): when the text's recent n-gram occurred before, its
    continuation is the burst (one-hot drafts, no drafter call). `datastore` (edge_spec.decoding.datastore; or any
    object with its `propose(context, k)` and `max_n`): next, the continuation of the text's recent n-gram in the
    target's earlier answers (one-hot drafts too). Otherwise the MTP drafter drafts; `drafter` None: retrieval only
    (a pass where neither source proposes anything is a plain step)."""
    check_spec_args(k, min_confidence)
    check_request(prompt_ids, max_new_tokens, session.max_context)
    stats = SpecStats(k)
    model = CostModel(k) if adaptive else None
    fast_greedy = params.greedy and verifier is verify
    start = time.perf_counter()
    session.reset()
    out = session.prefill(prompt_ids)
    token = pick_token(out.logits[-1], params, rng)  # the one token not yet in the cache
    hidden = out.hidden[-1]  # [Ht] target state at the position that predicted `token`
    prefill_s = time.perf_counter() - start
    tokens = [token]
    retrieval = PromptLookup() if lookup is True else (lookup or None)
    if retrieval is not None:
        retrieval.extend(list(prompt_ids) + tokens)
    if on_token:
        on_token(token)
    while token not in stop_ids and len(tokens) < max_new_tokens:
        left = max_new_tokens - len(tokens) - 1
        if (cap := session.pass_cap()) is not None:  # a pass the kernels would score unlike decode steps (kv.pass_cap)
            left = min(left, cap - 1)
        t0 = time.perf_counter()
        drafts, source = [], False  # the CostModel's source key: False MTP, True lookup, DATASTORE
        if retrieval is not None:  # retrieval first, at its own length (CostModel prices the sources apart)
            k_now = min(model.choose(lookup=True) if model else k, left)
            drafts, source = _lookup_drafts(retrieval.propose(k_now), stop_ids), True
            stats.lookup_calls += 1
            stats.lookup_s += time.perf_counter() - t0
        if not drafts and datastore is not None:  # then the static datastore, at its own length
            ts = time.perf_counter()
            k_now = min(model.choose(lookup=DATASTORE) if model else k, left)
            context = _tail(prompt_ids, tokens, datastore.max_n)
            drafts, source = _lookup_drafts(datastore.propose(context, k_now) if k_now else [], stop_ids), DATASTORE
            stats.datastore_calls += 1
            stats.datastore_s += time.perf_counter() - ts
        from_lookup = bool(drafts)
        if from_lookup:  # one-hot drafts: q(draft) = 1, so verify's rule keeps the target's distribution
            draft_probs = SparseRows(vocab_size)
            for d in drafts:
                draft_probs.append(np.array([d]), np.array([1.0]))
        else:
            k_now = 0 if drafter is None else min(model.choose() if model else k, left)
            drafts, draft_probs = _draft(drafter, session, token, hidden, k_now, params, rng, stop_ids, vocab_size,
                                         min_confidence if adaptive else 0.0, fast_greedy)
        stats.k_chosen.append(k_now)
        t1 = time.perf_counter()
        out = session.forward([token] + drafts)  # [1 + len(drafts)] positions
        t2 = time.perf_counter()
        if fast_greedy:  # the one-hot case of `verify`, without one-hot rows
            n, nxt = verify_greedy(drafts, out.logits.argmax(axis=-1))
        else:
            n, nxt = verifier(drafts, draft_probs, LazyRows(out.logits, params), rng)
        session.commit(n + 1)
        hidden = out.hidden[n]
        stats.drafter_s += t1 - t0
        stats.target_s += t2 - t1
        stats.target_calls += 1
        stats.drafted[:len(drafts)] += 1
        stats.accepted[:n] += 1
        stats.emitted_by_passes += n + 1
        if source == DATASTORE and from_lookup:
            stats.datastore_passes += 1
            stats.datastore_accepted += n
        elif from_lookup:
            stats.lookup_passes += 1
            stats.lookup_accepted += n
        else:
            stats.drafter_calls += len(drafts)
        if model:
            model.observe_verify(1 + len(drafts), t2 - t1)
            if drafts and not from_lookup:  # retrieval's drafts cost nothing to make
                model.observe_draft((t1 - t0) / len(drafts))
            if drafts:
                model.observe_acceptance(len(drafts), n, lookup=source if from_lookup else False)
        emitted = len(tokens)
        for t in drafts[:n] + [nxt]:
            tokens.append(t)
            if on_token:
                on_token(t)
            if t in stop_ids or len(tokens) >= max_new_tokens:
                break
        if retrieval is not None:
            retrieval.extend(tokens[emitted:])
        token = tokens[-1]
    end = time.perf_counter()
    stats.decode_s = end - start - prefill_s
    stop = "eos" if tokens[-1] in stop_ids else "length"
    result = GenerationResult(tokens, len(prompt_ids), stop, prefill_s, end - start)
    result.extra["spec"] = stats
    return result


def _tail(prompt_ids: Sequence[int], tokens: list[int], n: int) -> list[int]:
    """The last n tokens of prompt + output (all there are when fewer)."""
    tail = tokens[-n:]
    return list(prompt_ids[max(len(prompt_ids) - (n - len(tail)), 0):]) + tail if len(tail) < n else tail


def _lookup_drafts(proposal: Sequence[int], stop_ids) -> list[int]:
    """A retrieval proposal, cut after a stop token (nothing is drafted past the end of the text)."""
    drafts = []
    for t in proposal:
        drafts.append(t)
        if t in stop_ids:
            break
    return drafts


def _draft(drafter: DrafterBackend, session: Session, token: int, hidden: np.ndarray, k: int,
           params: SamplingParams, rng, stop_ids, vocab_size: int, min_confidence: float, fast_greedy: bool):
    """Propose up to k drafts after `token`; stops early at a stop token or a low-confidence draft.

    Returns (drafts, their distributions as SparseRows; left empty for `verify_greedy`, which needs argmaxes only)."""
    drafts, probs = [], SparseRows(vocab_size)
    if k == 0:
        return drafts, probs
    drafter.begin(session.length, session.state.drafter_masks(), session.length)
    for _ in range(k):
        step = drafter.step(token, hidden)
        if fast_greedy:
            token = greedy_draft(step.token_ids, step.logits)
        else:
            ids, q = sparse_draft_distribution(step, params)
            token = int(ids[sample(q, rng)])
            probs.append(ids, q)
        drafts.append(token)
        if token in stop_ids or (min_confidence and confidence(step, token) < min_confidence):
            break
        hidden = step.hidden
    return drafts, probs
