"""Attention maths, one pure function per form (no module state): what `edge_spec.model.forms` picks from.

Shapes: q [1 or B, H, T, D]; caches and new rows [1, H_kv, S or T, D]; masks additive (0 visible, a large negative
value hidden). Grouped-query attention folds the H query heads into H_kv groups of G = H / H_kv.
"""

from __future__ import annotations

import torch


def attend(q: torch.Tensor, ks: tuple, vs: tuple, mask: torch.Tensor, scale: float) -> torch.Tensor:
    """Attention over keys cat(ks) / values cat(vs), without building the concatenation.

    q: [B, H, T, D]; ks[i], vs[i]: [B, H_kv, S_i, D] (the cache, then the new rows);
    mask: [B or 1, 1, T, sum S_i] additive -> [B, T, H * D]. Grouped-query attention without copying
    K/V: query heads are folded to [B, H_kv, G, T, D]. (Runtimes use B = 1; training batches sequences.)
    Scoring the parts separately avoids copying the whole cache every step (eager and exported graphs).
    """
    b, h, t, d = q.shape
    h_kv = ks[0].shape[1]
    qg = q.reshape(b, h_kv, h // h_kv, t, d)
    scores = torch.cat([torch.matmul(qg, k.unsqueeze(2).transpose(-1, -2)) for k in ks], dim=-1) * scale
    probs = torch.softmax(scores.float() + mask.unsqueeze(1), dim=-1).type_as(q)  # [B, H_kv, G, T, sum S_i]
    out, start = None, 0
    for v in vs:
        n = v.shape[2]
        part = torch.matmul(probs[..., start:start + n], v.unsqueeze(2))  # [B, H_kv, G, T, D]
        out = part if out is None else out + part
        start += n
    return out.reshape(b, h, t, d).transpose(1, 2).reshape(b, t, h * d)


def attend_concat(q: torch.Tensor, ks: tuple, vs: tuple, mask: torch.Tensor, scale: float,
                  keep: torch.Tensor | None = None) -> torch.Tensor:
    """Attention over cat(ks) / cat(vs) in 4-D tensors and the ops an accelerator compiler takes (MatMul, Concat,
    Add, Mul, Softmax, Reshape, Transpose: no scatter, tile, expand or 5-D view): the placed form's attention.

    q: [1, H, T, D]; ks[i], vs[i]: [1, H_kv, S_i, D] (the cache, then the new rows); mask: [1, 1, T, sum S_i]
    additive -> [1, T, H * D]. Query rows are group-major per KV head (row g*T + t: query head g at step t), the
    mask repeated by concatenation. Masked entries must be finite and low enough that exp() of them is 0 against
    the row's real scores (a quantized mask input has a calibrated range: the format's mask floor).
    `keep` [1, 1, T, sum S_i], 1 where the mask is 0 and 0 elsewhere (an input: exact 0 / 1 after quantization)
    makes what a masked slot holds unable to reach a row, whatever the kernels do with zeros: masked scores are
    zeroed before the mask is added, masked probabilities after the softmax, and each row's values are multiplied
    by its own keep before the value matmul (`masked_values`). Why each of the three is needed (measured on an
    accelerator whose softmax leaves masked entries a small weight): docs/architecture.md, "the placed form"."""
    b, h, t, d = q.shape
    h_kv = ks[0].shape[1]
    g = h // h_kv
    qg = q.reshape(b, h_kv, g * t, d)  # [1, H_kv, G*T, D]
    keys = torch.cat(ks, dim=2) if len(ks) > 1 else ks[0]  # [1, H_kv, S + T, D]
    values = torch.cat(vs, dim=2) if len(vs) > 1 else vs[0]
    grouped = torch.cat([mask] * g, dim=2) if g > 1 else mask  # [1, 1, G*T, S + T]
    scores = torch.matmul(qg, keys.transpose(-1, -2)) * scale
    if keep is None:
        probs = torch.softmax(scores + grouped, dim=-1)
        out = torch.matmul(probs, values)  # [1, H_kv, G*T, D]
        return out.reshape(b, h, t, d).transpose(1, 2).reshape(b, t, h * d)
    kept = torch.cat([keep] * g, dim=2) if g > 1 else keep
    probs = torch.softmax(scores * kept + grouped, dim=-1) * kept  # [1, H_kv, G*T, S]
    return masked_values(probs, values, keep, g)


def masked_values(probs: torch.Tensor, values: torch.Tensor, keep: torch.Tensor, g: int) -> torch.Tensor:
    """P.V with each row's masked values zeroed: probs [1, H_kv, G*T, S] (group-major rows), values [1, H_kv, S, D],
    keep [1, 1, T, S] -> [1, T, H * D]. A batched matmul per (KV head, step) over [H_kv, T, S, D] values: T times
    the values' size (SmolLM2, 256 slots, a pass of 9: 0.9 MB per layer at 16 bits)."""
    _, h_kv, rows, s = probs.shape
    t, d = rows // g, values.shape[-1]
    per_step = probs.reshape(h_kv, g, t, s).transpose(1, 2)  # [H_kv, T, G, S]
    zeroed = values.reshape(h_kv, 1, s, d) * keep.reshape(1, t, s, 1)  # [H_kv, T, S, D]
    out = torch.matmul(per_step, zeroed)  # [H_kv, T, G, D]
    return out.transpose(0, 1).reshape(1, t, h_kv * g * d)  # heads in order kv * G + g


def place_rows(cache: torch.Tensor, new: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """cache [1, H_kv, S, D] with the new rows [1, H_kv, T, D] in their slots, by data movement only: slot j takes
    row index[j] of cat(cache, new) (index [S] ints: j, or S + r where row r writes slot j). `write_rows` without a
    scatter (which accelerator compilers may not take) and without arithmetic (which would rescale quantized
    values). The gather runs on axis 0 of a [S + T, H_kv * D] view (a gather on axis 2 of a 4-D tensor was
    measured wrong on one accelerator: docs/architecture.md, "the placed form")."""
    both = torch.cat([cache, new], dim=2)  # [1, H_kv, S + T, D]
    _, h, n, d = both.shape
    picked = both.transpose(1, 2).reshape(n, h * d).index_select(0, index.long())  # [S, H_kv * D]
    return picked.reshape(1, -1, h, d).transpose(1, 2)  # [1, H_kv, S, D]


def slot_mask(mask: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Fold the new-row columns of a mask into the slots those rows take: [1, 1, T, S + T] -> [1, 1, T, S].

    slots: [T] (full attention: slot == position). The slots' own cache columns are masked (empty) already.
    """
    t = slots.shape[0]
    s = mask.shape[-1] - t
    return mask[..., :s].scatter(-1, slots.view(1, 1, 1, t).expand(1, 1, t, t), mask[..., s:])


def write_rows(cache: torch.Tensor, rows: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """cache [1, H_kv, S, D] with rows [1, H_kv, T, D] written to slots [T] (out of place: a graph input stays read-only)."""
    index = slots.view(1, 1, -1, 1).expand(rows.shape)
    return cache.scatter(2, index, rows)


def group_mask(mask: torch.Tensor, groups: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[1, 1, T, S] additive mask -> (additive, keep) [1, 1, G*T, S] for query rows laid out group-major
    (row g*T + t is query head g of a KV head at step t), as `attend_slots` scores them. Built once per forward
    and group count, so no layer reshapes its scores to broadcast the mask."""
    tiled = mask.repeat(1, 1, groups, 1)
    return tiled, tiled == 0


# The longest reduction a blocked CPU GEMM is taken to sum in one block whatever the matrix widths: onnxruntime's sgemm
# (MLAS) sums K in blocks of 128 when the output has more than 64 columns and in one block when it has fewer
# (measured: gemma-3-270m, head dim 256, docs/architecture.md "Long heads").
LONGEST_SINGLE_BLOCK = 128


def _scores(qg: torch.Tensor, keys: torch.Tensor, scale: float, keys_major: bool) -> torch.Tensor:
    """Scaled scores [1, H_kv, R, N] of query rows qg [1, H_kv, R, D] against keys [1, H_kv, N, D].

    keys_major: computed as keys @ qg^T ([N, D] x [D, R], transposed back: a small copy), so the GEMM's output
    columns are the query rows, whatever the key count. Then the cache's scores (N = S keys) and the new keys'
    scores (N = T + 1) sum D in the same blocks; scored query-major, a D longer than one block is summed in
    one block for the few new keys and in two for the cache (`LONGEST_SINGLE_BLOCK`), and a key scored in a
    verify pass differs from the same key read back from the cache in the next step."""
    if keys_major:
        return (torch.matmul(keys, qg.transpose(-1, -2)) * scale).transpose(-1, -2)  # [1, H_kv, R, N]
    return torch.matmul(qg, keys.transpose(-1, -2)) * scale


def attend_slots(q: torch.Tensor, k_cache: torch.Tensor, k_new: torch.Tensor, slots: torch.Tensor, v: torch.Tensor,
                 mask: torch.Tensor, keep: torch.Tensor, scale: float, pad_keys: bool = True) -> torch.Tensor:
    """Batch-invariant attention: row t of the output is bit-identical whatever T is (decode T=1 == verify T=k+1).

    q: [1, H, T, D]; k_cache: [1, H_kv, S, D] as bound (the new rows' slots hold stale values); k_new: [1, H_kv, T, D],
    the new rows, which belong in `slots` [T], or None when k_cache already holds them there (the `state` binding:
    the program wrote them into its cache buffers first); v: [1, H_kv, S, D] with the new rows already in their slots
    (`write_rows`); mask, keep: [1, 1, G*T, S] (`group_mask` of the [1, 1, T, S] mask, G = H / H_kv) -> [1, T, H * D].
    Why (measured, docs/architecture.md "Exactness of quantized bundles"): every key's score and every value sits
    in the same column in both cases (no cache-part / new-part split of the value sum, which would run in another
    order), the matmuls always have >= 2 rows (a 1-row matmul takes another CPU kernel with another summation
    order), masked probabilities are exact zeros, and extra masked columns at the end only add zeros. The new
    keys' scores are computed apart and written into their slots' columns (a score is one dot product over D
    whichever matmul computes it), so only the small score matrix is copied per layer, not the K cache. For the
    same reason the new keys' scores must not be a single-column matmul at T = 1 (onnxruntime takes a
    matrix-vector kernel for an untransposed [D, 1] operand: measured on Gemma-4, ~4e-7 in fp32): `pad_keys`
    appends a zero key. The packed-qkv path (llama family, `Ops.qkv`) passes False: its head-major keys
    reach the matmul as a transposed operand (FusedMatMul transB), which keeps the blocked kernel (tested bit for
    bit; the pad cost ~1% of int8 decode there). Heads longer than `LONGEST_SINGLE_BLOCK` (Gemma-3: 256) are
    scored keys-major (`_scores`), so both score matmuls block their sum over D alike.
    """
    b, h, t, d = q.shape
    h_kv = k_cache.shape[1]
    g = h // h_kv
    pad = g == 1  # one query head per KV head: add a zero row so that T = 1 still runs a >= 2-row matmul
    qg = q.reshape(b, h_kv, g * t, d)  # [1, H_kv, G*T, D]
    if pad:
        qg = torch.cat([qg, torch.zeros_like(qg[:, :, :1])], dim=2)
    keys_major = k_new is not None and d > LONGEST_SINGLE_BLOCK
    scores = _scores(qg, k_cache, scale, keys_major)  # [1, H_kv, G*T (+1), S]
    if k_new is None:  # `state` binding: the cache already holds the new keys in their slots
        scores = scores[:, :, :g * t]
    elif pad_keys or keys_major:  # [1, H_kv, T + 1, D]: >= 2 key rows / columns, the extra one dropped again
        k_pad = torch.cat([k_new, torch.zeros_like(k_new[:, :, :1])], dim=2)
        new_scores = _scores(qg, k_pad, scale, keys_major)[..., :t]  # [1, H_kv, G*T (+1), T]
    else:
        new_scores = _scores(qg, k_new, scale, keys_major)  # [1, H_kv, G*T (+1), T]
    if k_new is not None:
        index = slots.view(1, 1, 1, t).expand(new_scores.shape)
        scores = scores.scatter(-1, index, new_scores)[:, :, :g * t]  # [1, H_kv, G*T, S]
    probs = torch.where(keep, torch.softmax(scores.float() + mask, dim=-1), 0.0).type_as(q)  # [1, H_kv, G*T, S]
    if pad:
        probs = torch.cat([probs, torch.zeros_like(probs[:, :, :1])], dim=2)
    out = torch.matmul(probs, v)[:, :, :g * t]  # [1, H_kv, G*T, D]
    return out.reshape(b, h, t, d).transpose(1, 2).reshape(b, t, h * d)
