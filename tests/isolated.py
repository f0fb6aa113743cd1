"""Run a test body in a fresh interpreter (multiprocessing's spawn start method).

For code that cannot share a process with what earlier tests of the same pytest worker may have loaded: the native
runner's library and ExecuTorch's Python LLM ops both register llama::update_cache_* kernels, and ExecuTorch aborts
the process on the second registration (edge_spec.runtimes.native_capi refuses to load then). `fn` must be a
module-level function of an importable module (tests.test_x); its arguments and result must pickle. An assertion
that fails in the child is raised again here with its message.
"""

from __future__ import annotations

import multiprocessing


def isolated(fn, *args, timeout: float = 900):
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply_async(fn, args).get(timeout)
