"""`edge-spec bench-head`: the rows' arithmetic (candidates, vocabulary skipped, MACs), not its timings; bench's defaults."""

from edge_spec.benchmark.bench_head import markdown, run


def test_bench_head_rows_count_the_candidates_and_the_vocabulary_skipped(tiny_llama):
    rows = run(str(tiny_llama[0]), hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, top_k=2,
               clusters=(8, 16), context=8, repeats=1)
    dense, c8, c16 = rows
    vocab = dense["vocab"]
    assert (dense["head"], dense["candidates"], dense["skipped"]) == ("dense", vocab, 0.0)
    assert dense["head_macs"] == 32 * vocab
    for row, clusters in ((c8, 8), (c16, 16)):
        assert row["candidates"] == 2 * vocab // clusters
        assert row["skipped"] == 1 - row["candidates"] / vocab
        assert row["head_macs"] == 32 * (clusters + 2 * vocab // clusters)
    table = markdown(rows)
    assert table.count("\n") == 4 and f"| clustered | 16 | 2 | {c16['candidates']} | 87.5% |" in table


def test_the_default_prompt_files_exist():
    """bench's and eval-drafter's defaults (a subpackage move once left bench's pointing nowhere)."""
    from edge_spec.benchmark.bench import DEFAULT_PROMPTS as BENCH
    from edge_spec.train.evaluate import DEFAULT_PROMPTS as HELDOUT, read_prompts

    assert len(read_prompts(BENCH)) >= 3 and len(read_prompts(HELDOUT)) >= 3
