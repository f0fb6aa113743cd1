"""Lean ExecuTorch programs (exporters/executorch_quant.py): what constants a .pte holds. An 8da4w program keeps no
fp32 array of the vocabulary table's size (the table is the 8-bit head's codes, read by
quantized_decomposed::embedding_byte).

Tiny random llama (tied table, a clustered drafter scoring with the target's table): the fp32 bundle is the
session's (tests/conftest.py); the 8da4w one is exported here (~1 min); the native
runner reads it (tests/test_native.py's build).
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest

from edge_spec.api import load_bundle
from edge_spec.contract.backend import Session
from edge_spec.exporters.executorch import PROGRAM_FILE, WEIGHTS_FILE, export_bundle
from edge_spec.runtimes.torch import TorchBackend
from edge_spec.contract.manifest import read_manifest
from edge_spec.errors import ConfigError
from tests.parity import chunked_logits, prompt_ids
from tests.test_native import native  # noqa: F401 (the build fixture)
from tests.tiers import LONG, long_variant

FLOAT32 = 6  # executorch's ScalarType.FLOAT
ELEMENT_BYTES = {0: 1, 1: 1, 2: 2, 3: 4, 4: 8, 5: 2, 6: 4, 7: 8, 11: 1, 15: 2}  # ScalarType -> bytes


class Constant(NamedTuple):
    where: str  # "program" (a constant tensor of the program's methods) | "delegate" (XNNPACK's named data)
    dtype: int | None  # executorch ScalarType (program constants); None for delegate data (raw bytes)
    shape: tuple[int, ...] | None
    nbytes: int
    buffer: tuple[str, int]  # (file, buffer index): constants with the same one are stored once


def bundle_constants(folder: Path) -> list[Constant]:
    """Every constant an ExecuTorch bundle stores: the program's constant tensors (deduplicated across methods by
    buffer index) and the named data its delegates packed (XNNPACK's weights, keyed by content hash), in the .pte or,
    for programs exported since 2026-12-06 night, in the weights file (exporters/executorch.py WEIGHTS_FILE), where
    both kinds are named data: a program constant by its name with a tensor layout, a delegate's by its hash."""
    from executorch.exir._serialize._cord import Cord
    from executorch.exir._serialize._program import deserialize_pte_binary
    from executorch.exir.schema import Tensor
    from executorch.extension.flat_tensor.serialize.serialize import FlatTensorSerializer

    pte = deserialize_pte_binary((folder / PROGRAM_FILE).read_bytes())
    seen = {}
    for plan in pte.program.execution_plan:
        for value in plan.values:
            t = value.val
            if isinstance(t, Tensor) and t.data_buffer_idx > 0 and t.allocation_info is None:
                shape = tuple(t.sizes)
                nbytes = int(np.prod(shape, dtype=np.int64)) * ELEMENT_BYTES.get(int(t.scalar_type), 4)
                seen[t.data_buffer_idx] = Constant("program", int(t.scalar_type), shape, nbytes,
                                                   ("pte", t.data_buffer_idx))
    found = list(seen.values())
    if pte.named_data is not None:
        for entry in pte.named_data.pte_data.values():
            found.append(Constant("delegate", None, None, len(pte.named_data.buffers[entry.buffer_index]),
                                  ("pte-named", entry.buffer_index)))
    if (folder / WEIGHTS_FILE).is_file():
        data = FlatTensorSerializer().deserialize(Cord((folder / WEIGHTS_FILE).read_bytes()))
        for key, entry in data.named_data.items():
            layout = entry.tensor_layout
            nbytes = len(data.buffers[entry.buffer_index])
            if layout is None:
                found.append(Constant("delegate", None, None, nbytes, ("ptd", entry.buffer_index)))
            else:
                found.append(Constant("program", int(layout.scalar_type), tuple(layout.sizes), nbytes,
                                      ("ptd", entry.buffer_index)))
    return found


class Forms(dict):
    """grid -> the tiny llama + drafter exported at it, on first use (~1 min each)."""

    def __init__(self, pair, root: Path):
        super().__init__()
        self.pair, self.root = pair, root

    def __missing__(self, grid: str) -> Path:
        _, target, drafter = self.pair
        self[grid] = export_bundle(target, self.root / grid, drafter=drafter, precision=grid, max_context=64)
        return self[grid]


@pytest.fixture(scope="module")
def llama_8da4w_forms(tiny_llama_pte_pair, tmp_path_factory) -> Forms:
    """The tiny llama + drafter at each 8da4w grid: XNNPACK's symmetric int4 fitted to calibration prompts, and the
    GGUF-exact codes with their block-offset term."""
    return Forms(tiny_llama_pte_pair, tmp_path_factory.mktemp("lean"))


# the default grid in the fast tier; the GGUF-exact one is a variant (tests/tiers.py)
@pytest.fixture(params=["8da4w", long_variant("8da4w-gguf")])
def llama_8da4w(request, llama_8da4w_forms, tiny_llama_pte_pair):
    _, target, drafter = tiny_llama_pte_pair
    return llama_8da4w_forms[request.param], target, drafter


def test_8da4w_program_holds_no_fp32_table_and_its_codes_once(llama_8da4w):
    """No fp32 constant with as many elements as a quarter of the table (an 8-bit table's scales are 1/H of it, a
    4-bit one's scales and zero points 1/32 each), nothing larger than an 8-bit table anywhere (program or XNNPACK
    data), and one table of codes, which the target's embedding and the drafter's gather both read and whose bytes
    are also XNNPACK's head weight: one buffer in the weights file."""
    from edge_spec.exporters.executorch_quant import TABLE_BITS

    folder, target, _ = llama_8da4w
    v, h = target.config.vocab_size, target.config.hidden_size
    constants = bundle_constants(folder)
    fp32 = [c for c in constants if c.where == "program" and c.dtype == FLOAT32 and c.nbytes >= v * h]
    assert not fp32, f"fp32 constants of table size: {fp32}"
    assert max(c.nbytes for c in constants) <= v * h, sorted(constants, key=lambda c: -c.nbytes)[:3]
    codes = [c for c in constants if c.where == "program" and c.shape == (v, h * TABLE_BITS // 8)]
    assert len({c.buffer for c in codes}) == 1 and codes[0].buffer[0] == "ptd", codes  # names may differ, not bytes
    head = [c for c in constants if c.where == "delegate" and c.buffer == codes[0].buffer]
    assert head, "the head's XNNPACK weight is not the table's buffer: the table is stored twice"


def test_fp32_program_stores_its_tied_table_once(tiny_llama_pte_pair):
    """The fp32 program's tied table is the embedding's constant, XNNPACK's head weight and the drafter's scoring
    table: one buffer of the weights file (the .pte used to hold two copies)."""
    folder, target, _ = tiny_llama_pte_pair
    v, h = target.config.vocab_size, target.config.hidden_size
    constants = bundle_constants(folder)
    tables = [c for c in constants if c.nbytes == v * h * 4]
    kinds = {c.where for c in tables}
    assert kinds == {"program", "delegate"} and len({c.buffer for c in tables}) == 1, tables


def test_the_weights_file_is_listed_and_a_missing_one_is_refused(tiny_llama_pte_pair, tmp_path):
    """Every method's manifest entry names the weights file; a bundle without it is refused naming the file."""
    import shutil

    from edge_spec.errors import BundleError

    folder, _, _ = tiny_llama_pte_pair
    assert {g.data for g in read_manifest(folder).graphs.values()} == {WEIGHTS_FILE}
    copy = shutil.copytree(folder, tmp_path / "bundle")
    (copy / WEIGHTS_FILE).unlink()
    with pytest.raises(BundleError, match="weights.ptd is missing"):
        load_bundle(copy, host_check=False)


def test_8da4w_tables_keep_agreement_and_greedy_exactness(llama_8da4w, tmp_path):
    """int8 dynamic activations x int4 weights (groups of 32) and the quantized table and head: logits within a
    relative bound of eager fp32 on the tiny llama (set when torchao's symmetric int4 measured 6-9% of the logits'
    scale; the exact-code form of edge_spec.exporters.exact_int4 passes it too), top-1 agreement >= 0.85, verify rows
    == decode steps (one forward of the prompt vs one token at a time), greedy speculative == plain; a precision
    the format has not is refused."""
    folder, target, _ = llama_8da4w
    assert read_manifest(folder).precision in ("8da4w", "8da4w-gguf")
    engine = load_bundle(folder, threads=2)
    ref = Session(TorchBackend(target.model, engine.session.state.layout))
    ids = prompt_ids(24, seed=11)
    a, b = engine.session.forward(ids).logits, ref.forward(ids).logits
    assert np.abs(a - b).max() <= 0.25 * np.abs(b).max()
    assert (a.argmax(-1) == b.argmax(-1)).mean() >= 0.85
    engine.session.reset()
    np.testing.assert_array_equal(chunked_logits(engine.session, ids[:8], 1), a[:8])
    engine.session.reset()
    plain = engine.generate(ids[:8], max_new_tokens=24, speculative=False)
    assert engine.generate(ids[:8], max_new_tokens=24, spec_k=2).tokens == plain.tokens
    with pytest.raises(ConfigError, match="no precision"):
        export_bundle(target, tmp_path / "bad", precision="int8")


@LONG  # exports the GGUF-exact variant
def test_the_native_grid_stores_no_offset_term(llama_8da4w_forms, tiny_llama_pte_pair):
    """8da4w stores XNNPACK's own int4 blocks only; 8da4w-gguf adds an fp32 offset per block of 32 inputs of every
    target Linear (and the drafter's): the native bundle's constants are smaller by at least the target's offsets
    less what the native grid adds (a bias correction: one float per output)."""
    _, target, _ = tiny_llama_pte_pair
    gguf, ours = (sum(c.nbytes for c in bundle_constants(llama_8da4w_forms[p])) for p in ("8da4w-gguf", "8da4w"))
    cfg = target.config
    h, i = cfg.hidden_size, cfg.intermediate_sizes[0]
    kv = cfg.kv_heads[0] * cfg.head_dims[0]
    outputs = h * 2 + kv * 2 + i * 2 + h  # q, o, k, v, gate, up, down
    per_layer = (h * 2 + kv * 2 + i * 2) * (h // 32) + h * (i // 32)  # the offsets, [N, K / 32] per Linear
    assert gguf - ours >= 4 * cfg.num_layers * (per_layer - outputs), (gguf, ours)


def test_native_runner_reads_the_quantized_table_as_python_does(native, llama_8da4w, tmp_path):  # noqa: F811
    """The native runner (build/native, `make native`; it links executorch's kernels_quantized) on the 8da4w
    bundle: plain and speculative greedy tokens == the Python runtime's."""
    import json
    import subprocess

    from tests.test_native import python_plain

    binary = native / "edge-spec-run"
    folder = llama_8da4w[0]
    ids = prompt_ids(8, seed=3)
    want, _ = python_plain(folder, ids, n=24)
    for flags in (["--no-spec"], []):
        done = subprocess.run([str(binary), "--bundle", str(folder), "--prompt-ids", ",".join(map(str, ids)),
                               "--max-new-tokens", "24", "--ignore-eos", "--threads", "2", "--json", *flags],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["tokens"] == want, flags


def test_a_prefill_chunk_asks_the_method_for_its_last_row_only(tiny_llama_pte_pair):
    """kv.LOGIT_ROWS in the target method: a prefill chunk's head runs on its last row; that row == the same row of an
    every-row pass, and prefill returns it."""
    folder, _, _ = tiny_llama_pte_pair
    backend = load_bundle(folder, host_check=False).session.backend
    assert backend.logit_rows
    returned = []  # the logits shape of each call

    class Spy:
        def __init__(self, method):
            self.method = method

        def execute(self, inputs):
            out = self.method.execute(inputs)
            returned.append(tuple(out[0].shape))
            return out

    backend.method = Spy(backend.method)
    session = Session(backend)
    tokens = prompt_ids(7)
    every = session.forward(tokens)
    last = session.forward(tokens, last_only=True)
    vocab = every.logits.shape[-1]
    assert returned == [(1, 7, vocab), (1, 1, vocab)]
    np.testing.assert_allclose(last.logits[0], every.logits[-1], rtol=0, atol=1e-5)
    np.testing.assert_array_equal(session.prefill(tokens).logits, last.logits)
