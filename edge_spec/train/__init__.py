"""Drafter training pipeline: corpora -> teacher pass (hidden states + source-layer K/V, cached in
shards) -> multi-step MTP distillation -> evaluation. Entry points: `edge-spec train-drafter`,
`edge-spec eval-drafter`."""
