"""The KV-cache contract: one source of truth for cache layout, IO names, masks and slot bookkeeping.

Logical model (shared by every runtime and every exported format):
  * cached layer `l` has `k_cache.{l}` / `v_cache.{l}`: [1, H_kv, S_l, D_l] (batch 1).
    `S_l` is the max context for full-attention layers and a ring for sliding-window layers.
  * positions are absolute; the runtime (this module) owns the position counter, slot positions,
    masks and commit/rewind. Graphs keep no hidden counters.
  * invariant: the cache holds every token except the last emitted one; after a verify that
    accepted `n` drafts the runtime commits `n + 1` rows.
  * binding `io`: caches are graph inputs, the graph returns only the new rows [1, H_kv, T, D];
    the runtime writes the committed rows (write-after-verify).
  * binding `shared`: caches are graph inputs and outputs (`k_present.{l}`, [1, H_kv, S_l, D_l]) that the runtime
    binds to the same buffers; a pass writes all its T rows at slot == position (rejected drafts too, then
    masked and overwritten), as onnxruntime's GroupQueryAttention does, plus a dummy row in the slot after them
    (`SHARED_SPARE_SLOTS`: the runtime binds up to S_l + 1 slots). Slot == position, so a sliding layer keeps
    max_context slots too (its kernel attends over the window itself; the pages of slots not yet written are never
    touched: runtimes/io_caches.py `lazy_zeros`).
  * binding `state`: the program owns the caches and writes every row of a pass.
  * rings: W + 1 slots (the drafter reads W + 1 keys), or W + max_pass - 1 when the layout caps the
    tokens per forward (`max_pass`): exported graphs place a forward's new keys in their ring slots
    before attending (batch-invariant attention), which must not evict a key the same forward still reads.
  * a sliding key at position p is visible to a query at position q iff 0 <= q - p < window.
  * rewinding across an eviction raises `KVStateError` instead of returning wrong logits.

The graph sees, per attention kind, keys = cat(cache slots [S], new rows [T]) and an additive
mask [1, 1, T, S + T] built here from the slot positions.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from edge_spec.errors import ConfigError
from edge_spec.model.config import FULL, SLIDING  # noqa: F401 (re-exported: the attention kinds, spelled once)

NEG_INF = np.float32(-1e30)  # finite: a fully masked row can never turn into NaN


# ---- IO names: the only place they are spelled ---------------------------------------------
INPUT_IDS = "input_ids"  # [1, T] int64
POSITION_IDS = "position_ids"  # [1, T] int64
LOGITS = "logits"  # [1, T, V] float32
HIDDEN = "hidden"  # [1, T, H] float32 (final hidden state, after the final norm)
# optional target input (ONNX bundles since 2026-12-05): the rows of the pass whose logits and hidden the graph returns,
# [R] int64 (R <= T; outputs [1, R, V] / [1, R, H]). A prefill chunk asks for its last row only: the vocabulary head
# over every row of a 64-token chunk was most of a long prompt's prefill (gemma-3-270m: a 262,144 x 640 head)
LOGIT_ROWS = "logit_rows"


def mask_name(kind: str) -> str:  # [1, 1, T, S_kind + T] float32 additive
    return f"mask.{kind}"


def k_cache_name(layer: int) -> str:
    return f"k_cache.{layer}"


def v_cache_name(layer: int) -> str:
    return f"v_cache.{layer}"


def k_new_name(layer: int) -> str:
    return f"k_new.{layer}"


def v_new_name(layer: int) -> str:
    return f"v_new.{layer}"


def k_present_name(layer: int) -> str:  # `shared` binding: the cache as written by the pass (same buffer as k_cache)
    return f"k_present.{layer}"


def v_present_name(layer: int) -> str:
    return f"v_present.{layer}"


# drafter step graph (one draft step; it reads the target's caches under the target's names k_cache.{l})
EMBED_TABLE = "embed_table"  # [V, Ht] float32: the target's input embedding table (unscaled), shared, not copied
OUTPUT_TABLE = "output_table"  # [V, Ht] float32: the target's output table, only when untied and head_from="target"
# int8 / int4 bundles of a tied target: the vocabulary table once, 8-bit (llama.cpp's Q8_0 grid): w = (code - 128) * scale
# per block of TABLE_BLOCK along Ht. The same bytes are the target's output-head weight (MatMulNBits) and the data of
# both graphs' embedding lookups (GatherBlockQuantized): no float copy of the table anywhere
EMBED_Q8 = "embed_table_q8"  # [V, Ht / TABLE_BLOCK, TABLE_BLOCK] uint8
EMBED_SCALES = "embed_table_scales"  # [V * Ht / TABLE_BLOCK] float32 (either form's)
# int4 bundles (onnxruntime's native 4-bit grid): w = (code - zero point) * scale per block, two codes per byte (the
# first in the low nibble), the zero points two per byte too, packed per row as MatMulNBits takes them
EMBED_Q4 = "embed_table_q4"  # [V, Ht / TABLE_BLOCK, TABLE_BLOCK / 2] uint8
EMBED_ZERO_POINTS = "embed_table_zero_points"  # [V * ceil(Ht / TABLE_BLOCK / 2)] uint8
TABLE_BLOCK = 32
TABLE_BITS = {EMBED_Q8: 8, EMBED_Q4: 4}  # a quantized table's codes -> its bits
# tables a target graph reads as initializers (runtimes bind them)
TARGET_TABLES = (EMBED_TABLE, EMBED_Q8, EMBED_Q4, EMBED_SCALES, EMBED_ZERO_POINTS)
DRAFT_TOKEN_IDS = "draft_token_ids"  # [N] int64 candidate ids (N = candidates per step)
DRAFT_LOGITS = "draft_logits"  # [N] float32
DRAFT_HIDDEN = "draft_hidden"  # [1, 1, Ht] float32, the `hidden` input of the next draft step

# EAGLE-3 drafters (drafter kind "eagle3"): the target graph also returns its residual streams at the drafter's aux
# layers for every row of the pass; an fc graph fuses them; the drafter graph keeps its own cache (`io` binding)
AUX_HIDDEN = "aux_hidden"  # [1, T, n * Ht] float32, n aux layers concatenated in the drafter's order
FUSED_HIDDEN = "fused_hidden"  # [1, T, Ht] float32: fc(cat(aux)), the `hidden` of the drafter's first rows
DRAFT_KIND = "draft"  # the kind of the drafter's own caches (slots_dim(DRAFT_KIND); layers numbered 0.. in the drafter)
DRAFT_MASK = "draft_mask"  # [1, 1, T, S_draft + T] float32 additive
# A burst's first step runs the rows the drafter has not seen (after a prompt: all of them) at most this many at a
# time, as the target's prefill chunks do: one pass over a 1,200-token prompt held [T, T] scores per head and took
# SmolLM2's native runner to 1,011 MB peak (docs/benchmarks.md "2026-12-07 (evening)")
EAGLE3_FIRST_CHUNK = 64


def draft_cache_names(layer: int) -> tuple[str, str]:  # the drafter's own K, V caches [1, H_kv, S_draft, D]
    return f"draft_k_cache.{layer}", f"draft_v_cache.{layer}"


def draft_new_names(layer: int) -> tuple[str, str]:  # their new rows [1, H_kv, T, D]
    return f"draft_k_new.{layer}", f"draft_v_new.{layer}"


# symbolic dims (exported graphs, manifest)
T_DIM = "T"  # new tokens in one forward
R_DIM = "R"  # rows with logits (LOGIT_ROWS)


def slots_dim(kind: str) -> str:
    """Symbolic cache length of one kind: `io` graphs take any slot prefix that holds every visible key."""
    return f"S_{kind}"


def feature_name(name: str) -> str:
    """A contract name as an identifier (Core ML features, C symbols): "k_cache.3" -> "k_cache_3"."""
    return name.replace(".", "_")


def mask_cols_dim(kind: str) -> str:
    return f"{slots_dim(kind)}+{T_DIM}"


# ---- layout ------------------------------------------------------------------------------------
BINDING_IO = "io"  # caches are graph inputs; the runtime writes committed rows (write-after-verify)
BINDING_STATE = "state"  # caches live in the program; a forward writes all its rows at their slots, rejected included
# caches are graph inputs *and* outputs bound to the same buffers: a forward writes all its rows at their slots (as
# `state`), e.g. onnxruntime's GroupQueryAttention in share-buffer mode. Slot == position (sliding layers too).
BINDING_SHARED = "shared"
# A `shared` graph appends one dummy row to every pass (so its fused attention never runs a one-row kernel, whose sums
# differ from the multi-row ones) and writes it into the slot after the pass: runtimes bind one spare slot.
SHARED_SPARE_SLOTS = 1
# onnxruntime's CPU GroupQueryAttention scores a pass with one sgemm [T', D] x [D, N] (N: keys visible to its last
# row, the dummy row's included), and MLAS sums the D terms in one block while N <= SCORE_EDGE but in blocks of
# SCORE_K_BLOCK beyond. With D > SCORE_K_BLOCK (gemma-3: 256) a row scored in a pass whose N crosses the edge differs
# in its last bits from the same row's decode step (docs/architecture.md "Fused attention over long heads"), so such a
# layout caps the verify passes that would cross it (`pass_cap`); the host check probes the edges.
SCORE_EDGE = 64
SCORE_K_BLOCK = 128
WRITES_ALL = (BINDING_STATE, BINDING_SHARED)  # bindings whose forwards write every row, rejected drafts included
CACHE_INPUTS = (BINDING_IO, BINDING_SHARED)  # bindings whose graphs take the caches as inputs


@dataclass(frozen=True)
class CacheSpec:
    """One cached target layer."""

    layer: int
    kind: str  # FULL | SLIDING
    num_kv_heads: int
    head_dim: int
    slots: int  # S_l
    window: int | None  # None for full attention

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (1, self.num_kv_heads, self.slots, self.head_dim)


@dataclass(frozen=True)
class KVLayout:
    caches: tuple[CacheSpec, ...]
    max_context: int
    max_pass: int | None = None  # most new tokens in one forward (prefill chunk, verify pass); None: any
    binding: str = BINDING_IO  # or BINDING_STATE: the caches are the program's own buffers

    def kinds(self) -> tuple[str, ...]:
        return tuple(sorted({c.kind for c in self.caches}))

    def slots(self, kind: str) -> int:
        return next(c.slots for c in self.caches if c.kind == kind)

    def window(self, kind: str) -> int | None:
        return next(c.window for c in self.caches if c.kind == kind)

    def to_json(self) -> dict:
        return {"max_context": self.max_context, "max_pass": self.max_pass, "binding": self.binding,
                "caches": [c.__dict__ | {"shape": list(c.shape)} for c in self.caches]}

    @staticmethod
    def from_json(d: dict) -> "KVLayout":
        fields = ("layer", "kind", "num_kv_heads", "head_dim", "slots", "window")
        max_pass = d.get("max_pass")  # absent in schema-1 manifests: no cap
        return KVLayout(tuple(CacheSpec(**{f: c[f] for f in fields}) for c in d["caches"]), int(d["max_context"]),
                        None if max_pass is None else int(max_pass), d.get("binding", BINDING_IO))

    def with_context(self, max_context: int) -> "KVLayout":
        """The same layout (same rings, same cap, same binding) for a smaller context. A `state` program's buffers
        have the exported sizes, so its layout cannot shrink (the runtime only uses fewer slots)."""
        caches = tuple(replace(c, slots=ring_slots(c.window, max_context, self.max_pass, self.binding)
                               if c.window else max_context) for c in self.caches)
        return KVLayout(caches, max_context, self.max_pass, self.binding)


DEFAULT_MAX_PASS = 64  # exported sliding-window targets: prefill chunks and verify passes of at most 64 tokens


def ring_slots(window: int, max_context: int, max_pass: int | None = None, binding: str = BINDING_IO) -> int:
    """Slots for a sliding layer, never more than the context.

    `io`: the target alone needs W - 1 past keys (write-after-verify); the drafter reads the W + 1 keys
    before the bonus token (transformers' Gemma-4 assistant semantics): W + 1 slots. A graph that writes a
    forward's T new keys into their slots (position % slots) before attending needs W + T - 1, so that the
    last new key never evicts one the first new row still sees: with a cap `max_pass` on T, W + max_pass - 1.
    `state`: the program writes every row of a pass, rejected drafts included, so after a pass of max_pass rows of
    which only one is accepted, the drafter's window (W + 1 keys before the bonus token at p + 1) must still be
    whole: the rows written reach p + max_pass - 1, the window starts at p - W, so W + max_pass slots.
    `shared`: no ring (slot == position, as a fused kernel writes it): max_context slots.
    """
    if binding == BINDING_SHARED:
        return max_context
    if binding == BINDING_STATE:
        if max_pass is None:
            raise ConfigError("a `state` layout needs a cap on the tokens per pass (max_pass)")
        return min(window + max_pass, max_context)
    return min(window + max(2, max_pass or 0) - 1, max_context)


def pass_cap(layout: KVLayout, n_cached: int, min_rows: int = 1) -> int | None:
    """The most tokens a verify pass after `n_cached` committed ones may carry so that each of its rows is scored as
    its decode step scores it (None: any), in a session whose passes carry at least `min_rows` rows. Only `shared`
    layouts with heads longer than SCORE_K_BLOCK, and only while a decode step there still scores <= SCORE_EDGE keys
    (a step at p scores p + min_rows + the dummy row): then the pass, and the step of its last row, must too. Prefill
    chunks need no cap: plain and speculative decoding take the same ones."""
    if layout.binding != BINDING_SHARED or all(c.head_dim <= SCORE_K_BLOCK for c in layout.caches):
        return None
    if n_cached + min_rows + SHARED_SPARE_SLOTS > SCORE_EDGE:  # its decode steps score past the edge already
        return None
    return SCORE_EDGE - SHARED_SPARE_SLOTS - min_rows + 1 - n_cached  # the last row's step: <= SCORE_EDGE keys


def check_pass(layout: KVLayout, n_new: int) -> None:
    """Refuse a forward over more tokens than the layout's graphs accept (`max_pass`)."""
    if layout.max_pass is not None and n_new > layout.max_pass:
        raise ConfigError(f"one forward over {n_new} tokens exceeds this bundle's limit of {layout.max_pass} tokens "
                          "per pass (its sliding-window rings are sized for it)",
                          f"use --spec-k {layout.max_pass - 1} or less (prefill is chunked automatically), or "
                          f"re-export with --max-pass {n_new}")


def drafter_window(window: int | None) -> int | None:
    """The drafter's query at position p sees sliding keys at p - W - 1 .. p - 1 (attention_mask semantics)."""
    return None if window is None else window + 2


# ---- graph IO tables: the order and shapes every exporter, manifest and runtime use -----------------
@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str  # "int64" | "float32"
    shape: tuple[int | str, ...]  # ints, or symbolic dim names (T_DIM, slots_dim(kind), ...)

    def to_json(self) -> dict:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}

    @staticmethod
    def from_json(d: dict) -> "TensorSpec":
        return TensorSpec(d["name"], d["dtype"], tuple(d["shape"]))


@dataclass(frozen=True)
class GraphIO:
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]


def _cache_specs(caches, names) -> list[TensorSpec]:
    return [TensorSpec(name(c.layer), "float32", (1, c.num_kv_heads, slots_dim(c.kind), c.head_dim))
            for c in caches for name in names]


def target_io(layout: KVLayout, vocab_size: int, hidden_size: int, logit_rows: bool = False,
              aux_size: int = 0) -> GraphIO:
    """Target prefill/verify/decode graph: T new tokens -> logits, hidden. `io` binding: the caches are inputs and
    the new rows outputs; `state`: the program keeps the caches (its masks' S_kind = the slots it attends over).
    `logit_rows`: the graph takes LOGIT_ROWS last and returns logits / hidden of those R rows only.
    `aux_size` (n * Ht; 0: none): the graph also returns AUX_HIDDEN [1, T, aux_size] after HIDDEN (eagle3 drafters)."""
    t = T_DIM
    r = R_DIM if logit_rows else T_DIM
    inputs = [TensorSpec(INPUT_IDS, "int64", (1, t)), TensorSpec(POSITION_IDS, "int64", (1, t))]
    inputs += [TensorSpec(mask_name(kind), "float32", (1, 1, t, mask_cols_dim(kind))) for kind in layout.kinds()]
    outputs = [TensorSpec(LOGITS, "float32", (1, r, vocab_size)), TensorSpec(HIDDEN, "float32", (1, r, hidden_size))]
    if aux_size:
        outputs.append(TensorSpec(AUX_HIDDEN, "float32", (1, t, aux_size)))
    if layout.binding in CACHE_INPUTS:
        inputs += _cache_specs(layout.caches, (k_cache_name, v_cache_name))
    if logit_rows:
        inputs.append(TensorSpec(LOGIT_ROWS, "int64", (R_DIM,)))
    if layout.binding == BINDING_IO:
        outputs += [TensorSpec(name(c.layer), "float32", (1, c.num_kv_heads, t, c.head_dim))
                    for c in layout.caches for name in (k_new_name, v_new_name)]
    elif layout.binding == BINDING_SHARED:  # the caches again, bound to the input buffers (written in place)
        outputs += _cache_specs(layout.caches, (k_present_name, v_present_name))
    return GraphIO(tuple(inputs), tuple(outputs))


def has_logit_rows(io: GraphIO) -> bool:
    """Does a target graph take LOGIT_ROWS (and return only those rows)?"""
    return any(spec.name == LOGIT_ROWS for spec in io.inputs)


def aux_size(io: GraphIO) -> int:
    """The width n * Ht of a target graph's AUX_HIDDEN output (0: it has none)."""
    return next((int(spec.shape[-1]) for spec in io.outputs if spec.name == AUX_HIDDEN), 0)


def table_specs(vocab_size: int, hidden: int, bits: int = 0) -> list[TensorSpec]:
    """The shared embedding table as a drafter graph takes it: float32 [V, Ht] (bits 0), the 8-bit form (EMBED_Q8 +
    scales) or the 4-bit form (EMBED_Q4 + scales + zero points)."""
    if not bits:
        return [TensorSpec(EMBED_TABLE, "float32", (vocab_size, hidden))]
    blocks = hidden // TABLE_BLOCK
    if bits == 8:
        return [TensorSpec(EMBED_Q8, "uint8", (vocab_size, blocks, TABLE_BLOCK)),
                TensorSpec(EMBED_SCALES, "float32", (vocab_size * blocks,))]
    if bits == 4:
        return [TensorSpec(EMBED_Q4, "uint8", (vocab_size, blocks, TABLE_BLOCK // 2)),
                TensorSpec(EMBED_SCALES, "float32", (vocab_size * blocks,)),
                TensorSpec(EMBED_ZERO_POINTS, "uint8", (vocab_size * -(-blocks // 2),))]
    raise ValueError(f"a shared table has 0, 4 or 8 bits, not {bits}")


def table_bits(tables) -> int:
    """The bits of a bundle's shared table from its table names: 8 (EMBED_Q8), 4 (EMBED_Q4) or 0 (float32)."""
    return next((bits for name, bits in TABLE_BITS.items() if name in tables), 0)


def drafter_io(layout: KVLayout, sources: dict[str, int], vocab_size: int, target_hidden: int, candidates: int,
               output_table: bool, tables: bool = True, table_bits: int = 0) -> GraphIO:
    """Drafter step graph: (last token, hidden, position, masks, source-layer caches, tables) -> candidates, hidden.
    `state` binding: no caches and no tables (the program's drafter method reads the target's cache buffers and
    weights in place). `tables=False`: the graph holds the tables as constants (a Core ML package, which stores
    weights the drafter and target functions share once). `table_bits`: the table's quantized form (8 or 4; 0: float32)."""
    by_layer = {c.layer: c for c in layout.caches}
    kinds = sorted(sources)
    inputs = [TensorSpec(INPUT_IDS, "int64", (1, 1)), TensorSpec(HIDDEN, "float32", (1, 1, target_hidden)),
              TensorSpec(POSITION_IDS, "int64", (1, 1))]
    inputs += [TensorSpec(mask_name(kind), "float32", (1, 1, 1, slots_dim(kind))) for kind in kinds]
    if layout.binding in CACHE_INPUTS:
        inputs += _cache_specs([by_layer[sources[kind]] for kind in kinds], (k_cache_name, v_cache_name))
    if layout.binding in CACHE_INPUTS and tables:
        inputs += table_specs(vocab_size, target_hidden, table_bits)
        if output_table:
            inputs.append(TensorSpec(OUTPUT_TABLE, "float32", (vocab_size, target_hidden)))
    outputs = [TensorSpec(DRAFT_TOKEN_IDS, "int64", (candidates,)), TensorSpec(DRAFT_LOGITS, "float32", (candidates,)),
               TensorSpec(DRAFT_HIDDEN, "float32", (1, 1, target_hidden))]
    return GraphIO(tuple(inputs), tuple(outputs))


def eagle3_drafter_io(draft: KVLayout, hidden: int, draft_vocab: int, tables: tuple = ()) -> GraphIO:
    """EAGLE-3 drafter graph: T rows (target ids, hidden fused or chained, positions, DRAFT_MASK, its own caches, of
    the layout `draft`, then `tables`) -> the last row's Vd candidates (target ids), their logits, its chained
    hidden; every row's new K/V (the runtime writes them into its cache; a `state` layout: no caches in or rows
    out, the program writes each row into its slot, position - 1, and its mask's S_draft = the slots it attends
    over). `tables`: `table_specs` of the bundle's
    shared embedding when the drafter embeds tokens with the target's own table (Speculators' frozen verifier
    embedding: the graph gathers its rows from the bundle's one copy), () when it keeps a table of its own."""
    t, s = T_DIM, slots_dim(DRAFT_KIND)
    inputs = [TensorSpec(INPUT_IDS, "int64", (1, t)), TensorSpec(HIDDEN, "float32", (1, t, hidden)),
              TensorSpec(POSITION_IDS, "int64", (1, t)), TensorSpec(DRAFT_MASK, "float32", (1, 1, t, mask_cols_dim(DRAFT_KIND)))]
    own = draft.binding == BINDING_IO  # `state`: the program keeps the caches and writes the rows itself
    inputs += [TensorSpec(name, "float32", (1, c.num_kv_heads, s, c.head_dim))
               for c in draft.caches if own for name in draft_cache_names(c.layer)]
    inputs += list(tables)
    outputs = [TensorSpec(DRAFT_TOKEN_IDS, "int64", (draft_vocab,)), TensorSpec(DRAFT_LOGITS, "float32", (draft_vocab,)),
               TensorSpec(DRAFT_HIDDEN, "float32", (1, 1, hidden))]
    outputs += [TensorSpec(name, "float32", (1, c.num_kv_heads, t, c.head_dim))
                for c in draft.caches if own for name in draft_new_names(c.layer)]
    return GraphIO(tuple(inputs), tuple(outputs))


def eagle3_fc_io(aux_width: int, hidden: int) -> GraphIO:
    """EAGLE-3 fc graph: AUX_HIDDEN [1, T, n * Ht] (the target's rows) -> FUSED_HIDDEN [1, T, Ht]."""
    return GraphIO((TensorSpec(AUX_HIDDEN, "float32", (1, T_DIM, aux_width)),),
                   (TensorSpec(FUSED_HIDDEN, "float32", (1, T_DIM, hidden)),))


# ---- pure functions ----------------------------------------------------------------------------
def attention_mask(slot_pos: np.ndarray, query_pos: np.ndarray, window: int | None) -> np.ndarray:
    """slot_pos: [S] absolute position held by each slot (-1 = empty); query_pos: [T] consecutive.

    Returns the additive mask [T, S + T]: columns [0, S) are cache slots, [S, S + T) the new rows.
    """
    q = query_pos[:, None]  # [T, 1]
    dist_cache = q - slot_pos[None, :]  # [T, S]
    visible_cache = (slot_pos[None, :] >= 0) & (dist_cache >= 0)
    dist_new = q - query_pos[None, :]  # [T, T]
    visible_new = dist_new >= 0
    if window is not None:
        visible_cache &= dist_cache < window
        visible_new &= dist_new < window
    visible = np.concatenate([visible_cache, visible_new], axis=1)
    return np.where(visible, np.float32(0.0), NEG_INF).astype(np.float32)


def source_caches(layout: KVLayout, sources: dict[str, int]) -> dict[str, int]:
    """A drafter's kv_sharing (kind -> target layer) as kind -> index into `layout.caches`, sorted by kind (every
    runtime and exporter maps it the same way)."""
    index = {c.layer: i for i, c in enumerate(layout.caches)}
    return {kind: index[int(layer)] for kind, layer in sorted(sources.items())}


def bucket_slots(need: int, slots: int, bucket: int) -> int:
    """How many cache slots a runtime binds (or lets a program attend over) so that `need` of them are visible: the
    smallest multiple of `bucket` >= need, capped at the layer's slot count. Attention cost then grows with the
    context in use, and shapes change only once per `bucket` tokens."""
    return min(slots, max(bucket, -(-need // bucket) * bucket))


def commit_slots(start: int, n: int, slots: int, ring: bool) -> tuple[np.ndarray, np.ndarray]:
    """Which of the new rows [0, n) land in which slots when committing positions start..start+n-1.

    Full layers: slot == position. Rings: slot == position % slots, and only the last `slots` rows
    are written (earlier ones would be overwritten in the same commit). Returns (rows, slot_ids).
    """
    rows = np.arange(n, dtype=np.int64)
    if ring and n > slots:
        rows = rows[n - slots:]
    pos = start + rows
    return rows, (pos % slots if ring else pos)
