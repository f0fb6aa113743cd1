"""Peak resident memory and speed of a decode through the Python API in a fresh process: `make demo`'s bundle decoding
its demo prompts (64 new tokens each), the host check run afresh (point EDGE_SPEC_CACHE at an empty folder). `off`
patches out the runtime's fixed mmap threshold (runtimes/ort.py return_freed_buffers) for an A/B. One JSON line.

    EDGE_SPEC_CACHE=$(mktemp -d) .venv/bin/python scripts/python_memory.py on|off [BUNDLE]
"""

import json
import sys
import time

variant = sys.argv[1]
bundle = sys.argv[2] if len(sys.argv) > 2 else "bundles/smollm2-int4-shared"
import edge_spec.runtimes.ort as ort_runtime  # noqa: E402

if variant == "off":
    ort_runtime.return_freed_buffers = lambda: False
from edge_spec.api import load_bundle  # noqa: E402


def peak_mb() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) // 1024 for line in status if line.startswith("VmHWM:"))


engine = load_bundle(bundle, threads=2)
start, n, tokens = time.perf_counter(), 0, []
for line in open("edge_spec/assets/prompts/demo.jsonl"):
    p = json.loads(line)
    r = engine.generate(engine.tokenizer.encode_prompt(p["prompt"], chat=p.get("chat", False)), max_new_tokens=64)
    n += len(r.tokens)
    tokens.append(r.tokens)
print(json.dumps({"variant": variant, "tok_s": round(n / (time.perf_counter() - start), 1), "peak_mb": peak_mb(),
                  "tokens": sum(map(len, tokens)), "first": [t[:4] for t in tokens]}))
