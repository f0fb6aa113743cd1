"""ONNX exporter: the target graph (prefill / verify / decode, symbolic T) and the drafter step graph.

Both follow the `io` binding of the KV contract (edge_spec/contract/kv.py): caches are graph inputs with a
symbolic length per attention kind (`S_full`, `S_sliding`), graphs return only the new K/V rows
[1, H_kv, T, D]; IO names, order and shapes come from `kv.target_io` / `kv.drafter_io`.

Choices (see docs/architecture.md, "ONNX Runtime path"):
  * one target graph for every T (prefill chunks, verify, T=1 decode): the weights dominate a decode step;
  * symbolic cache length, so the runtime binds only the slot prefix in use (no attention over 2048 empty
    slots); caches keep the contract's head-major [1, H_kv, S, D] layout;
  * full attention is batch-invariant (edge_spec.model.attention.attend_slots): every key's score and every value sits
    in its slot's column (slot == position; the new V rows are written into a copy of the bound V cache, the
    new keys' scores into the cache scores), so a verify pass reproduces T=1 decode steps bit for bit; this
    costs one copy of the bound V prefix per layer and step (measured in docs/architecture.md). Sliding
    layers do the same in ring slots (slot = position % ring): the bundle caps the tokens per forward
    (`max_pass`, default 64) and its rings hold W + max_pass - 1 keys, so that no new key of a forward
    evicts one an earlier row of the same forward still reads (`kv.ring_slots`);
  * with the dynamo exporter the target uses onnxruntime's fused RotaryEmbedding (rope tables of max_context
    rows) and SkipSimplifiedLayerNormalization (residual add + RMSNorm) kernels and packed q/k/v and gate/up
    projections (`onnx_fused.FusedOps`; SmolLM2 int8: 1,383 -> 805 nodes per step, ~15-20% faster
    decode, measured in docs/architecture.md);
  * the target's input embedding table is written once, raw, as `onnx/embed_table.bin`: the target graph
    reads it as external data of its `embed_table` initializer and the drafter graph takes it as an input
    (the runtime binds one memory-mapped buffer to both), so the drafter embeds tokens - and a
    `head_from="target"` drafter scores them - without a second copy. An untied target with such a
    drafter also gets `output_table.bin` (its lm_head), the one case with a duplicate;
  * precisions: fp32; fp16 (onnxruntime's float16 converter, float32 IO, `to_float16`); int8 / int4 =
    weight-only MatMulNBits (blocks of 32, int8 activations = accuracy level 4): int8 symmetric codes (as
    Q8_0: no offset term, ~14% faster than asymmetric), int4 asymmetric min/max codes (GGUF Q4_1 weights
    exactly) with an 8-bit output head. onnxruntime's own quantizers were measured and rejected:
    quantize_dynamic (per-tensor uint8 activations) and symmetric int4 agreed with fp32 on only ~60% of
    SmolLM2's top-1 tokens;
  * exporter: dynamo (default; leaner graphs, ~15% faster decode than TorchScript's shape-op chains) or
    TorchScript (`exporter="torchscript"`, ~10x faster to export). Both work with torch 2.13.

Exporters import the core only, never runtimes.
"""

from __future__ import annotations

import contextlib
import functools
import tempfile
import warnings
from pathlib import Path

import numpy as np
import onnx
import torch
import torch.nn.functional as F
from onnx import numpy_helper
from torch import nn

from edge_spec.contract import bundle
from edge_spec.contract import kv
from edge_spec.contract.bundle import COMMON_STEPS
from edge_spec.model.drafter import Drafter
from edge_spec.errors import ConfigError, ExportError
from edge_spec.contract.formats import FORMATS, check_precision
from edge_spec.logs import quiet
from edge_spec.contract.manifest import GraphEntry, TableEntry
from edge_spec.model.forms import SPLIT, Form, Slots
from edge_spec.model.ops import EAGER, Ops
from edge_spec.model.transformer import Transformer
from edge_spec.exporters.onnx_fused import FusedOps

ONNX_DIR = "onnx"
TARGET_FILE = f"{ONNX_DIR}/target.onnx"
DRAFTER_FILE = f"{ONNX_DIR}/drafter.onnx"
TABLE_FILES = {kv.EMBED_TABLE: f"{ONNX_DIR}/embed_table.bin", kv.OUTPUT_TABLE: f"{ONNX_DIR}/output_table.bin"}
OPSET = 18
QUANT_BLOCK = 32
# precision -> (weight bits, output-head bits, symmetric codes)
QUANT_BITS = {"int8": (8, 8, True), "int4": (4, 8, False)}
# MatMulNBits with int8 activations: the only fast CPU kernels (fp32 activations, or float zero points, ran ~10x
# slower here, and 8-bit float zero points are refused), so int4's asymmetric codes keep the symmetric kernel and
# add a per-block offset term; int8 is symmetric like llama.cpp's Q8_0 and needs no offset term.
ACCURACY_LEVEL = 4


# ---- flat-tensor wrappers (the exported signatures) ----------------------------------------------------
class TargetGraph(nn.Module):
    """(input_ids, position_ids, masks per kind, k/v caches per cached layer) -> (logits, hidden, k/v new rows)."""

    def __init__(self, model: Transformer, kinds: tuple[str, ...], form: Form, ops: Ops):
        super().__init__()
        self.model, self.kinds, self.form, self.ops = model, kinds, form, ops

    def forward(self, input_ids, position_ids, masks: tuple, caches: tuple):
        out = self.model(input_ids, position_ids, dict(zip(self.kinds, masks)), list(caches[0::2]),
                         list(caches[1::2]), form=self.form, ops=self.ops)
        rows = [r for k, v in zip(out.new_k, out.new_v) for r in (k, v)]
        return (out.logits, out.hidden, *rows)


class DrafterGraph(nn.Module):
    """(token, hidden, position, masks, source caches, tables) -> (candidate ids, their logits, next hidden)."""

    def __init__(self, drafter: Drafter, kinds: tuple[str, ...], embed_scale: float):
        super().__init__()
        self.drafter, self.kinds, self.embed_scale = drafter, kinds, embed_scale

    def forward(self, input_ids, hidden, position_ids, masks: tuple, caches: tuple, tables: tuple):
        token_embed = F.embedding(input_ids, tables[0]) * self.embed_scale  # the target's embed(), [1, 1, Ht]
        pairs = [(caches[2 * i], caches[2 * i + 1]) for i in range(len(self.kinds))]
        kv_in = {kind: (k, v) for kind, (k, v) in zip(self.kinds, pairs)}
        head_table = tables[-1] if self.drafter.cfg.head_from == "target" else None
        out = self.drafter(token_embed, hidden, position_ids, dict(zip(self.kinds, masks)), kv_in, head_table)
        return out.token_ids, out.logits, out.hidden


# ---- export ------------------------------------------------------------------------------------------
EXPORTERS = ("dynamo", "torchscript")


def _torch_export(module: nn.Module, args: tuple, dynamic_shapes: tuple, io: kv.GraphIO,
                  exporter: str = "dynamo") -> onnx.ModelProto:
    """torch.onnx.export with the contract's IO names; symbolic dims from `io` (TorchScript) or `dynamic_shapes`
    (dynamo). Both give the same maths to within fp32 rounding; dynamo's graphs decode faster, TorchScript
    exports in seconds instead of about a minute for SmolLM2."""
    if exporter not in EXPORTERS:
        raise ConfigError(f"unknown exporter {exporter!r}", f"choose one of {', '.join(EXPORTERS)}")
    names = {"input_names": [t.name for t in io.inputs], "output_names": [t.name for t in io.outputs]}
    with quiet("torch.onnx"), warnings.catch_warnings(), contextlib.redirect_stdout(None), \
            tempfile.TemporaryDirectory() as work:
        warnings.simplefilter("ignore")
        try:
            if exporter == "torchscript":
                axes = {t.name: {i: d for i, d in enumerate(t.shape) if isinstance(d, str)} for t in io.inputs + io.outputs}
                path = Path(work) / "graph.onnx"
                torch.onnx.export(module, args, str(path), dynamo=False, opset_version=OPSET, do_constant_folding=True,
                                  dynamic_axes={k: v for k, v in axes.items() if v}, **names)
                proto = onnx.load(path)
            else:
                program = torch.onnx.export(module, args, dynamo=True, dynamic_shapes=dynamic_shapes, optimize=True,
                                            opset_version=OPSET, verbose=False, **names)
                proto = program.model_proto
        except Exception as err:  # the exporters raise many types; say which graph failed and why
            lines = [line for line in str(err).splitlines() if line.strip()]
            cause = next((line for line in lines if line.startswith("<class")), lines[0] if lines else "")
            raise ExportError(f"torch.onnx.export ({exporter}) failed for {type(module).__name__}: {cause}",
                              "try the other exporter, or use the eager runtime (--runtime torch)") from err
    _canonical_io(proto, io)
    return proto


_DTYPES = {"float32": onnx.TensorProto.FLOAT, "int64": onnx.TensorProto.INT64}


def _canonical_io(proto: onnx.ModelProto, io: kv.GraphIO) -> None:
    """Give graph inputs/outputs the contract's names, order and symbolic dim names (checking fixed dims)."""
    for role, values, specs in (("input", proto.graph.input, io.inputs), ("output", proto.graph.output, io.outputs)):
        if [v.name for v in values] != [s.name for s in specs]:
            raise ExportError(f"exported {role}s {[v.name for v in values]} differ from the contract "
                              f"{[s.name for s in specs]}")
        for value, spec in zip(values, specs):
            ttype = value.type.tensor_type
            if ttype.elem_type != _DTYPES[spec.dtype]:
                raise ExportError(f"exported {role} {spec.name} has ONNX type {ttype.elem_type}, expected {spec.dtype}")
            if len(ttype.shape.dim) != len(spec.shape):
                raise ExportError(f"exported {role} {spec.name} has rank {len(ttype.shape.dim)}, expected "
                                  f"{len(spec.shape)}")
            for dim, want in zip(ttype.shape.dim, spec.shape):
                if isinstance(want, int):
                    if dim.HasField("dim_value") and dim.dim_value != want:
                        raise ExportError(f"exported {role} {spec.name} has shape {ttype.shape}, expected {spec.shape}")
                    dim.Clear()
                    dim.dim_value = want
                else:
                    if dim.HasField("dim_value"):
                        raise ExportError(f"exported {role} {spec.name}: dim {want} was specialised to "
                                          f"{dim.dim_value} (it must stay symbolic)")
                    dim.Clear()
                    dim.dim_param = want


def _blank_unused_outputs(proto: onnx.ModelProto) -> None:
    """Unread optional outputs of contrib nodes -> "" (SkipSimplifiedLayerNormalization's float32 statistics:
    unnamed, the kernel skips them and the fp16 converter cannot mistype them)."""
    read = {name for node in proto.graph.node for name in node.input} | {o.name for o in proto.graph.output}
    blanked = set()
    for node in proto.graph.node:
        if node.domain == "com.microsoft":
            for i, name in enumerate(node.output):
                if i > 0 and name and name not in read:
                    node.output[i] = ""
                    blanked.add(name)
    kept = [v for v in proto.graph.value_info if v.name not in blanked]
    del proto.graph.value_info[:]
    proto.graph.value_info.extend(kept)


def _example_lengths(layout: kv.KVLayout) -> dict[str, int]:
    """Distinct example cache lengths per kind (never 0/1, which torch.export would specialise)."""
    return {kind: 5 + 2 * i for i, kind in enumerate(layout.kinds())}


ATTENTION_FORMS = ("slots", "split")


def export_target(model: Transformer, layout: kv.KVLayout, *, exporter: str = "dynamo",
                  attention: str = "slots") -> onnx.ModelProto:
    """The target graph. `attention`: "slots" (batch-invariant, edge_spec.model.attention.attend_slots; what bundles ship) or
    "split" (cache part + new part, the form before 2026-11-30): kept only as the negative control of the exactness
    tests and the host check, which must find it not batch-invariant."""
    if attention not in ATTENTION_FORMS:
        raise ConfigError(f"unknown attention form {attention!r}", f"choose one of {', '.join(ATTENTION_FORMS)}")
    cfg = model.cfg
    io = kv.target_io(layout, cfg.vocab_size, cfg.hidden_size)
    kinds = layout.kinds()
    t, lengths = 3, _example_lengths(layout)
    ids = torch.randint(0, cfg.vocab_size, (1, t))
    start = min(lengths.values()) - t  # full-attention layers write the new rows into slots == positions
    pos = torch.arange(start, start + t)[None]
    masks = tuple(torch.zeros(1, 1, t, lengths[kind] + t) for kind in kinds)
    caches = tuple(torch.randn(1, c.num_kv_heads, lengths[c.kind], c.head_dim) for c in layout.caches for _ in "kv")
    t_dim = torch.export.Dim(kv.T_DIM, min=1, max=layout.max_context)
    s_dims = {kind: torch.export.Dim(kv.slots_dim(kind), min=1, max=layout.slots(kind)) for kind in kinds}
    dynamic = ({1: t_dim}, {1: t_dim}, tuple({2: t_dim, 3: torch.export.Dim.AUTO} for _ in kinds),
               tuple({2: s_dims[c.kind]} for c in layout.caches for _ in "kv"))
    ring = layout.slots(kv.SLIDING) if kv.SLIDING in kinds and layout.max_pass is not None else None  # uncapped: split
    form = Slots(ring) if attention == "slots" else SPLIT  # batch-invariant attention (edge_spec.model.forms)
    ops = FusedOps(model, layout.max_context) if exporter == "dynamo" else EAGER  # TorchScript cannot emit them
    proto = _torch_export(TargetGraph(model, kinds, form, ops).eval(), (ids, pos, masks, caches), dynamic, io, exporter)
    _blank_unused_outputs(proto)
    return proto


def export_drafter(drafter: Drafter, target: Transformer, layout: kv.KVLayout, sources: dict[str, int], *,
                   exporter: str = "dynamo") -> onnx.ModelProto:
    cfg = target.cfg
    kinds = tuple(sorted(sources))
    output_table = needs_output_table(cfg, drafter)
    io = kv.drafter_io(layout, sources, cfg.vocab_size, cfg.hidden_size, drafter.cfg.candidates_per_step, output_table)
    by_layer = {c.layer: c for c in layout.caches}
    lengths = _example_lengths(layout)
    ids = torch.randint(0, cfg.vocab_size, (1, 1))
    hidden = torch.randn(1, 1, cfg.hidden_size)
    pos = torch.tensor([[max(lengths.values())]])
    masks = tuple(torch.zeros(1, 1, 1, lengths[kind]) for kind in kinds)
    caches = tuple(torch.randn(1, by_layer[sources[k]].num_kv_heads, lengths[k], by_layer[sources[k]].head_dim)
                   for k in kinds for _ in "kv")
    tables = (target.model.embed_tokens.weight.detach(),)
    if output_table:
        tables += (target.lm_head.weight.detach(),)
    s_dims = {kind: torch.export.Dim(kv.slots_dim(kind), min=1, max=layout.slots(kind)) for kind in kinds}
    dynamic = (None, None, None, tuple({3: s_dims[k]} for k in kinds), tuple({2: s_dims[k]} for k in kinds for _ in "kv"),
               tuple({} for _ in tables))
    wrapper = DrafterGraph(drafter, kinds, float(target.embed_scale)).eval()
    return _torch_export(wrapper, (ids, hidden, pos, masks, caches, tables), dynamic, io, exporter)


def needs_output_table(cfg, drafter: Drafter | None) -> bool:
    """A head_from="target" drafter scores against the target's lm_head: a separate table only when untied."""
    return drafter is not None and drafter.cfg.head_from == "target" and not cfg.tie_word_embeddings


# ---- graph passes: tables, weight transposes, quantization, saving ------------------------------------
def _initializers(proto: onnx.ModelProto) -> dict[str, onnx.TensorProto]:
    return {t.name: t for t in proto.graph.initializer}


def _rename_embedding_table(proto: onnx.ModelProto, table: np.ndarray) -> None:
    """Name the initializer the token Gather reads `embed_table` (checked by value, not by exporter naming)."""
    inits = _initializers(proto)
    found = None
    for node in proto.graph.node:
        if node.op_type == "Gather" and node.input[1] == kv.INPUT_IDS and node.input[0] in inits:
            init = inits[node.input[0]]
            if tuple(init.dims) == table.shape and np.array_equal(numpy_helper.to_array(init), table):
                found = init.name
                break
    if found is None:
        raise ExportError("the exported target has no embedding Gather over input_ids with the embedding table")
    for node in proto.graph.node:
        node.input[:] = [kv.EMBED_TABLE if name == found else name for name in node.input]
    inits[found].name = kv.EMBED_TABLE


def _fold_weight_transposes(proto: onnx.ModelProto) -> None:
    """Transpose(2-D initializer) -> a transposed initializer, so quantizers see MatMuls with constant weights
    (the tied lm_head reads the embedding table through such a Transpose)."""
    inits = _initializers(proto)
    keep = []
    for node in proto.graph.node:
        src = inits.get(node.input[0]) if node.op_type == "Transpose" else None
        perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), [1, 0])
        if src is not None and len(src.dims) == 2 and perm == [1, 0]:
            proto.graph.initializer.append(numpy_helper.from_array(numpy_helper.to_array(src).T.copy(), node.output[0]))
            continue
        keep.append(node)
    del proto.graph.node[:]
    proto.graph.node.extend(keep)
    _drop_unused_initializers(proto)


def quantize_blocks(w: np.ndarray, bits: int, block: int = QUANT_BLOCK, *, symmetric: bool = False
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Block quantization of a MatMul weight w [K, N] (blocks of `block` along K, per output column).

    Returns (packed [N, K/block, block * bits / 8] uint8, scales [N * K/block], offsets [K/block, N] or None)
    with w[k, n] ~= (q[k, n] - 2^(bits-1)) * scale[n, k // block] (+ offset[k // block, n]), q in [0, 2^bits).
    Asymmetric: a block's min and max are represented exactly, so GGUF Q4_1 / Q8_1 weights (min + d * q) come
    back bit-exact (SmolLM2's built-in GGUF is Q4_1). Symmetric (no offset): scale = max |w| / (2^(bits-1) - 1),
    as llama.cpp's Q8_0.
    """
    k, n = w.shape
    kb = -(-k // block)
    wt = np.zeros((n, kb * block), dtype=np.float32)
    wt[:, :k] = w.T
    wt = wt.reshape(n, kb, block)
    zero = 2 ** (bits - 1)  # MatMulNBits' default zero point
    if symmetric:
        amax = np.abs(wt).max(-1)  # [N, kb]
        scale = np.where(amax > 0, amax / (zero - 1), 1.0).astype(np.float32)
        q = (np.clip(np.rint(wt / scale[..., None]), 1 - zero, zero - 1) + zero).astype(np.uint8)
        offset = None
    else:
        lo, hi = wt.min(-1), wt.max(-1)  # [N, kb]
        levels = 2 ** bits - 1
        scale = np.where(hi > lo, (hi - lo) / levels, 1.0).astype(np.float32)
        q = np.clip(np.rint((wt - lo[..., None]) / scale[..., None]), 0, levels).astype(np.uint8)
        offset = np.ascontiguousarray((lo + zero * scale).astype(np.float32).T)
    if bits == 4:
        q = q[..., 0::2] | (q[..., 1::2] << 4)  # two values per byte, the first in the low nibble
    return np.ascontiguousarray(q), scale.reshape(-1), offset


def _constant_weight(node, inits) -> np.ndarray | None:
    weight = inits.get(node.input[1]) if node.op_type == "MatMul" else None
    if weight is None or len(weight.dims) != 2 or weight.data_type != onnx.TensorProto.FLOAT:
        return None
    return numpy_helper.to_array(weight)


def _quantize_matmuls(proto: onnx.ModelProto, bits: int, head_bits: int, vocab_size: int,
                      symmetric: bool = False) -> None:
    """Every MatMul with a constant 2-D weight -> MatMulNBits(a) (+ (a @ block indicator) @ offsets if asymmetric).

    The offset term carries each block's minimum, so the fast symmetric kernel (no zero-point input) serves an
    asymmetric code. `a @ indicator` (per-block sums of the activations) is shared by MatMuls of one input,
    and sibling MatMuls of one input (q/k/v, gate/up) become one wide MatMulNBits + Split: per-column maths
    is unchanged and SmolLM2's int8 graph loses 210 of its ~1,900 per-step ops. The output head
    (N == vocab) gets `head_bits`."""
    inits = _initializers(proto)
    weights = {node.output[0]: _constant_weight(node, inits) for node in proto.graph.node}
    siblings: dict[tuple, list] = {}  # (input, K, bits) -> MatMul nodes, in graph order
    for node in proto.graph.node:
        w = weights[node.output[0]]
        if w is not None:
            nbits = head_bits if w.shape[1] == vocab_size else bits
            siblings.setdefault((node.input[0], w.shape[0], nbits), []).append(node)
    nodes, block_sums, extra, done = [], {}, [], set()
    for node in proto.graph.node:
        if weights[node.output[0]] is None:
            nodes.append(node)
            continue
        if node.output[0] in done:
            continue
        a = node.input[0]
        w0 = weights[node.output[0]]
        group = siblings[(a, w0.shape[0], head_bits if w0.shape[1] == vocab_size else bits)]
        nbits = head_bits if w0.shape[1] == vocab_size else bits
        done.update(m.output[0] for m in group)
        w = np.concatenate([weights[m.output[0]] for m in group], axis=1)  # [K, sum N]
        k, n = w.shape
        packed, scales, offsets = quantize_blocks(w, nbits, symmetric=symmetric)
        base = f"{inits[node.input[1]].name}.q{nbits}" + (f".x{len(group)}" if len(group) > 1 else "")
        out = node.output[0] if len(group) == 1 else base + ".out"
        matmul = onnx.helper.make_node("MatMulNBits", [a, base, base + ".scales"],
                                       [out if symmetric else out + ".main"], name=base + ".q", domain="com.microsoft",
                                       K=k, N=n, bits=nbits, block_size=QUANT_BLOCK, accuracy_level=ACCURACY_LEVEL)
        extra += [numpy_helper.from_array(packed, base), numpy_helper.from_array(scales, base + ".scales")]
        if symmetric:
            nodes.append(matmul)
        else:
            if (a, k) not in block_sums:
                kb = offsets.shape[0]
                indicator = np.zeros((k, kb), dtype=np.float32)
                indicator[np.arange(k), np.arange(k) // QUANT_BLOCK] = 1.0
                name = f"{a}.block_sums{len(block_sums)}"
                extra.append(numpy_helper.from_array(indicator, name + ".indicator"))
                nodes.append(onnx.helper.make_node("MatMul", [a, name + ".indicator"], [name], name=name))
                block_sums[(a, k)] = name
            extra.append(numpy_helper.from_array(offsets, base + ".offsets"))
            nodes += [
                matmul,
                onnx.helper.make_node("MatMul", [block_sums[(a, k)], base + ".offsets"], [out + ".offset"],
                                      name=base + ".offset"),
                onnx.helper.make_node("Add", [out + ".main", out + ".offset"], [out], name=base + ".add")]
        if len(group) > 1:
            sizes = np.array([weights[m.output[0]].shape[1] for m in group], dtype=np.int64)
            extra.append(numpy_helper.from_array(sizes, base + ".split"))
            nodes.append(onnx.helper.make_node("Split", [out, base + ".split"], [m.output[0] for m in group],
                                               name=base + ".split", axis=-1))
    del proto.graph.node[:]
    proto.graph.node.extend(nodes)
    proto.graph.initializer.extend(extra)
    _drop_unused_initializers(proto)
    if not any(o.domain == "com.microsoft" for o in proto.opset_import):
        proto.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1))


def _drop_unused_initializers(proto: onnx.ModelProto) -> None:
    used = {name for node in proto.graph.node for name in node.input} | {o.name for o in proto.graph.output}
    alive = [t for t in proto.graph.initializer if t.name in used]
    del proto.graph.initializer[:]
    proto.graph.initializer.extend(alive)


def to_float16(proto: onnx.ModelProto) -> onnx.ModelProto:
    """fp16 weights and compute with onnxruntime's own converter; graph IO stays float32 (`keep_io_types`), so
    caches, masks and the runtime are the same as fp32. Nodes that read a shared table (`embed_table`,
    `output_table`: the raw fp32 files both graphs bind) stay fp32, so the table is neither converted nor cast
    per step; the tied output head gets its own fp16 copy (the Transpose is folded first). For accelerator
    providers (CoreML / QNN / GPU); on this x86 CPU fp16 plain decode is ~10% slower than fp32
    (docs/architecture.md)."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    _fold_weight_transposes(proto)
    tables = set(TABLE_FILES)
    keep_fp32 = [n.name for n in proto.graph.node if tables & set(n.input)]
    table_inits = {}  # name -> a copy of the fp32 initializer, restored after conversion
    for t in proto.graph.initializer:
        if t.name in tables:
            table_inits[t.name] = onnx.TensorProto()
            table_inits[t.name].CopyFrom(t)
    with quiet("onnxruntime"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = convert_float_to_float16(proto, keep_io_types=True, node_block_list=keep_fp32,
                                       disable_shape_infer=True)
    # the converter stores float initializers as fp16 (and casts float graph inputs to fp16) and casts them back
    # for the fp32 nodes: undo both round trips for the tables (the raw fp32 files are the single copy)
    fp32_alias = {}  # Cast output -> the table it carries, for casts back to float32
    fp16_of = {}  # Cast output -> table, for casts of a table to fp16
    for node in out.graph.node:
        if node.op_type != "Cast":
            continue
        to = next(a.i for a in node.attribute if a.name == "to")
        src = node.input[0]
        table = src if src in tables else fp16_of.get(src) or fp32_alias.get(src)
        if table is not None:
            (fp32_alias if to == onnx.TensorProto.FLOAT else fp16_of)[node.output[0]] = table
    for node in out.graph.node:
        node.input[:] = [fp32_alias.get(name, name) for name in node.input]
    table_casts = fp32_alias.keys() | fp16_of.keys()
    kept = list(out.graph.node)
    while True:  # drop table casts nobody reads, back to front along each chain
        used = {name for node in kept for name in node.input} | {o.name for o in out.graph.output}
        alive = [n for n in kept
                 if not (n.op_type == "Cast" and n.output[0] in table_casts and n.output[0] not in used)]
        if len(alive) == len(kept):
            break
        kept = alive
    dangling = [n.name for n in kept if n.op_type == "Cast" and n.output[0] in table_casts]
    if dangling:
        raise ExportError(f"fp16 conversion left table casts that fp16 nodes still read: {dangling}")
    del out.graph.node[:]
    out.graph.node.extend(kept)
    for t in out.graph.initializer:
        if t.name in table_inits:
            t.CopyFrom(table_inits[t.name])
    _drop_unused_initializers(out)
    return out


def quantize(proto: onnx.ModelProto, precision: str, vocab_size: int) -> onnx.ModelProto:
    """fp32 (as is) | fp16 (`to_float16`) | int8 (8-bit weights) | int4 (4-bit weights, 8-bit output head);
    blocks of 32, see `quantize_blocks`. Activations are quantized to int8 per block inside MatMulNBits
    (accuracy level 4)."""
    if precision == "fp32":
        return proto
    if precision == "fp16":
        return to_float16(proto)
    check_precision(FORMATS["onnx"], precision)
    _fold_weight_transposes(proto)
    bits, head_bits, symmetric = QUANT_BITS[precision]
    _quantize_matmuls(proto, bits, head_bits, vocab_size, symmetric)
    return proto


def save_graph(proto: onnx.ModelProto, path: Path, tables: dict[str, str]) -> None:
    """Write `path` + `path.data` (external weights); initializers named in `tables` (name -> file relative to
    path's folder, already written raw) are pointed at those files instead of being copied."""
    for init in proto.graph.initializer:
        if init.name in tables:
            nbytes = int(np.prod(init.dims)) * 4
            init.ClearField("raw_data")
            del init.float_data[:]
            del init.external_data[:]
            for key, value in (("location", tables[init.name]), ("offset", "0"), ("length", str(nbytes))):
                entry = init.external_data.add()
                entry.key, entry.value = key, value
            init.data_location = onnx.TensorProto.EXTERNAL
    onnx.save_model(proto, path, save_as_external_data=True, all_tensors_to_one_file=True,
                    location=path.name + ".data", size_threshold=1024)
    for written in (path, path.with_name(path.name + ".data")):
        if written.exists():
            written.chmod(0o644)  # onnx creates the data file 0600; a bundle is meant to be copied and shared


def _write_table(path: Path, array: np.ndarray) -> np.ndarray:
    array = np.ascontiguousarray(array, dtype="<f4")
    path.parent.mkdir(parents=True, exist_ok=True)
    array.tofile(path)
    return array


# ---- the bundle --------------------------------------------------------------------------------------
def export_steps(with_drafter: bool) -> int:
    """How many times `export_bundle` calls `progress` (for a progress bar)."""
    return COMMON_STEPS + 2 + (2 if with_drafter else 0)


def writer(*, exporter: str = "dynamo", attention: str = "slots") -> bundle.Writer:
    """The onnx format's `write` for edge_spec.contract.bundle.export_bundle: `exporter` is torch.onnx's (dynamo |
    torchscript); `attention="split"` exports the non-batch-invariant form (a test-only negative control, see
    `export_target`). `max_pass` caps the tokens per forward only for targets with sliding-window layers (rings of
    W + max_pass - 1 slots); full-attention-only targets take any T and record no cap."""
    if exporter not in ("dynamo", "torchscript"):
        raise ConfigError(f"unknown torch.onnx exporter {exporter!r}", "choose dynamo or torchscript")
    return functools.partial(_write, exporter=exporter, attention=attention)


export_bundle = bundle.entry("onnx")  # export_bundle(target, out, *, drafter, precision, ..., exporter, attention)


def _write(job: bundle.ExportJob, *, exporter: str, attention: str) -> tuple[dict, dict]:
    """The ONNX artifacts: the shared tables, target.onnx (+ drafter.onnx), quantized to `job.precision`."""
    target, drafter, layout, precision, step = job.target, job.drafter, job.layout, job.precision, job.step
    cfg, tmp = target.config, job.tmp
    (tmp / ONNX_DIR).mkdir()
    tables = {kv.EMBED_TABLE: _table_entry(tmp, kv.EMBED_TABLE, target.model.model.embed_tokens.weight)}
    if needs_output_table(cfg, drafter):
        tables[kv.OUTPUT_TABLE] = _table_entry(tmp, kv.OUTPUT_TABLE, target.model.lm_head.weight)
    step("exporting the target graph")
    proto = export_target(target.model, layout, exporter=exporter, attention=attention)
    _rename_embedding_table(proto, target.model.model.embed_tokens.weight.detach().numpy())
    step(f"quantizing the target graph ({precision})" if precision != "fp32" else "saving the target graph")
    proto = quantize(proto, precision, cfg.vocab_size)
    save_graph(proto, tmp / TARGET_FILE, {kv.EMBED_TABLE: Path(TABLE_FILES[kv.EMBED_TABLE]).name})
    del proto
    graphs = {"target": GraphEntry(TARGET_FILE, precision, kv.target_io(layout, cfg.vocab_size, cfg.hidden_size))}
    if drafter is not None:
        step("exporting the drafter graph")
        dproto = export_drafter(drafter, target.model, layout, job.sources, exporter=exporter)
        step(f"quantizing the drafter graph ({precision})" if precision != "fp32" else "saving the drafter graph")
        dproto = quantize(dproto, precision, cfg.vocab_size)
        save_graph(dproto, tmp / DRAFTER_FILE, {})
        io = kv.drafter_io(layout, job.sources, cfg.vocab_size, cfg.hidden_size, drafter.cfg.candidates_per_step,
                           needs_output_table(cfg, drafter))
        graphs["drafter"] = GraphEntry(DRAFTER_FILE, precision, io)
    return graphs, tables


def _table_entry(tmp: Path, name: str, weight: torch.Tensor) -> TableEntry:
    array = _write_table(tmp / TABLE_FILES[name], weight.detach().float().numpy())
    return TableEntry(TABLE_FILES[name], "float32", tuple(array.shape))

