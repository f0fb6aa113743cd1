"""Why verify rows equal decode steps on the simulated HTP: the tiny llama (tests/tiny.py) exported to QNN with each of
the two exactness fixes switched off in turn, then per variant (a) does changing the keys / values in masked slots
change a target_5 pass's logits on the HTP (max |diff| per row), (b) the host check's verdict on the HTP.

    .venv/bin/python scripts/qnn_exactness_variants.py [--variants now no-value-zeroing no-encoding-fix neither transposed]

Variants: `now` (what the exporter does); `no-value-zeroing` (P.V over the probabilities alone, as before
2026-12-02: masked probabilities are exact zeros but the values are not zeroed); `no-encoding-fix` (the cache groups
without the tensors the new rows are reshaped from: `cache_groups(upstream=False)`); `neither`; `transposed` (P.V as
(V^T . P^T)^T without zeroed values: also stopped the leak on the simulator, not shipped). ~1 min per variant.
"""

from __future__ import annotations

import argparse
import functools
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ helpers (tiny checkpoints, feeds)

from edge_spec.loading import checkpoints  # noqa: E402
from edge_spec.model import attention  # noqa: E402
from edge_spec.runtimes import qnn_htp  # noqa: E402
from edge_spec.api import load_bundle  # noqa: E402
from edge_spec.exporters import qnn, qnn_calibration  # noqa: E402
from edge_spec.runtimes.qnn import open_session  # noqa: E402
from tests.test_onnx import tiny_drafter  # noqa: E402
from tests.test_qnn import SOC, masked_slot_feeds, with_random_slots  # noqa: E402
from tests.tiny import llama_config, save_reference  # noqa: E402


def heads(out: torch.Tensor, g: int) -> torch.Tensor:  # [1, H_kv, G*T, D] (group-major rows) -> [1, T, H * D]
    _, h_kv, rows, d = out.shape
    return out.reshape(1, h_kv * g, rows // g, d).transpose(1, 2).reshape(1, rows // g, h_kv * g * d)


def probabilities_only(probs, values, keep, g):  # P.V, masked values not zeroed (the form before 2026-12-02)
    return heads(torch.matmul(probs, values), g)


def transposed(probs, values, keep, g):  # (V^T . P^T)^T, masked values not zeroed
    return heads(torch.matmul(values.transpose(-1, -2), probs.transpose(-1, -2)).transpose(-1, -2), g)


VARIANTS = {"now": (attention.masked_values, True), "no-value-zeroing": (probabilities_only, True),
            "no-encoding-fix": (attention.masked_values, False), "neither": (probabilities_only, False),
            "transposed": (transposed, True)}


def run(name: str, work: Path) -> None:
    pv, upstream = VARIANTS[name]
    keep_pv, keep_groups = attention.masked_values, qnn_calibration.cache_groups
    attention.masked_values, qnn_calibration.cache_groups = pv, functools.partial(keep_groups, upstream=upstream)
    try:
        save_reference(llama_config(), work / "ref")
        target = checkpoints.load(str(work / "ref"))
        folder = qnn.export_bundle(target, work / "bundle", drafter=tiny_drafter(target.config, head_from="target"),
                                   max_context=64, max_draft_len=4, max_pass=9)
    finally:
        attention.masked_values, qnn_calibration.cache_groups = keep_pv, keep_groups
    session = open_session(folder / qnn_htp.ctx_file("target_5"), "qnn", SOC)
    feeds = masked_slot_feeds(session)
    base = session.run(["logits"], feeds)[0][0]
    leaks = {}
    for prefix in ("k_cache", "v_cache"):  # slots 11.. are masked for every row of the pass
        changed = with_random_slots(feeds, prefix, slice(11, None), seed=3)
        leaks[prefix] = float(np.abs(session.run(["logits"], changed)[0][0] - base).max())
    check = load_bundle(folder, host_check=False).check_host(cache=False)
    print(f"{name:18s} masked keys -> logits {leaks['k_cache']:.2e}, masked values -> logits {leaks['v_cache']:.2e}; "
          f"host check: one-row {check.one_row_max_diff:.2e}, two-row {check.two_row_max_diff:.2e} -> "
          f"{'exact' if check.exact else 'NOT exact'}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    args = parser.parse_args()
    for name in args.variants:
        with tempfile.TemporaryDirectory() as work:
            run(name, Path(work))


if __name__ == "__main__":
    main()
