"""What every exporter shares: argument checks, the KV layout, the drafter pairing, content hashes, the tokenizer
copy, the manifest and the atomic write (`atomic.write_bundle`). A format only supplies `write(job)`, which puts
its artifacts into `job.tmp` and returns their manifest entries (graphs and shared tables): its exporter module's
`writer(**options)` returns it. `export_bundle` is the one export entry, for every format.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from edge_spec.version import __version__
from edge_spec.contract import kv
from edge_spec.loading.checkpoints import LoadedModel
from edge_spec.contract.layout import kv_layout
from edge_spec.model.drafter import Drafter, pair
from edge_spec.model.eagle3 import Eagle3Config, Eagle3Drafter, check_eagle3_pair
from edge_spec.errors import ConfigError
from edge_spec.contract.formats import Format, check_binding, check_precision, exporter, get_format
from edge_spec.contract.atomic import write_bundle
from edge_spec.contract.manifest import (EAGLE3, EAGLE3_FORMATS, TOKENIZER_FILES, DrafterEntry, GraphEntry, Manifest,
                                        ModelEntry, TableEntry, content_id)

DEFAULT_MAX_DRAFT_LEN = 8
COMMON_STEPS = 3  # hashing the target, copying the tokenizer, writing the manifest


@dataclass(frozen=True)
class ExportJob:
    """What a format's `write` gets: a temp folder inside the future bundle, the models and the checked layout."""

    tmp: Path
    target: LoadedModel
    drafter: Drafter | Eagle3Drafter | None
    layout: kv.KVLayout
    sources: dict[str, int] | None  # drafter kind -> target layer whose cache it reads (MTP drafters)
    precision: str
    step: Callable[[str], None]  # progress: call before each of the format's steps
    max_draft_len: int = DEFAULT_MAX_DRAFT_LEN
    aux_layers: tuple[int, ...] = ()  # an eagle3 drafter's: the target graph returns kv.AUX_HIDDEN of these layers


Writer = Callable[[ExportJob], tuple[dict[str, GraphEntry], dict[str, TableEntry]]]
# writes a static datastore into the temp folder and returns its manifest entry (edge_spec.contract.datastore_check),
# or None when there is none for this target: (tmp, the target's content sha256) -> entry. The caller builds it (the
# index lives in edge_spec.decoding, above this layer): edge_spec.decoding.datastore_source.bundle_datastore.
DatastoreWriter = Callable[[Path, str], "dict | None"]


def export_bundle(target: LoadedModel, out: str | Path, *, format: str, drafter: Drafter | None = None,
                  drafter_source: str | None = None, precision: str | None = None, max_context: int | None = None,
                  max_draft_len: int = DEFAULT_MAX_DRAFT_LEN, max_pass: int | None = None,
                  progress: Callable[[str], None] | None = None, binding: str | None = None,
                  datastore: DatastoreWriter | None = None, **options) -> Path:
    """Export `target` (+ `drafter`) to a bundle of `format` at `out`, atomically (see `export`). `options`: the
    format's own, given to its exporter's `writer(**options)` (e.g. its registry row's export options), which
    checks them before any work. Each exporter module binds its format: `export_bundle = bundle.entry(NAME)`."""
    fmt = get_format(format)
    module = exporter(format)
    write = module.writer(**options)
    if binding is None and hasattr(module, "default_binding"):  # the format may pick per model (and options)
        binding = module.default_binding(target.config, **options)
    return export(target, out, fmt=fmt, write=write, drafter=drafter, drafter_source=drafter_source,
                  precision=precision, max_context=max_context, max_draft_len=max_draft_len, max_pass=max_pass,
                  progress=progress, binding=binding, datastore=datastore)


def entry(format: str) -> Callable[..., Path]:
    """`export_bundle` with `format` bound: what an exporter module exports as its own `export_bundle`."""
    return functools.partial(export_bundle, format=format)


def export(target: LoadedModel, out: str | Path, *, fmt: Format, write: Writer, drafter: Drafter | None = None,
           drafter_source: str | None = None, precision: str | None = None, max_context: int | None = None,
           max_draft_len: int = DEFAULT_MAX_DRAFT_LEN, max_pass: int | None = None,
           progress: Callable[[str], None] | None = None, binding: str | None = None,
           datastore: DatastoreWriter | None = None) -> Path:
    """Export `target` (+ `drafter`) to a bundle of format `fmt` at `out`, atomically; `progress(step)` before each step.

    `binding`: the KV binding (edge_spec.contract.kv; default the format's, one of `fmt.bindings`; `export_bundle`
    first asks the exporter module's `default_binding(cfg, **options)`, where it has one).
    `max_pass`: the most tokens one forward may carry (prefill chunk, verify pass). It sizes sliding rings (`io`:
    W + max_pass - 1 slots, `state`: W + max_pass) and, under the `state` binding, the program's planned buffers;
    default 64, or max_draft_len + 1 if larger. `io` targets without sliding layers take any T and record no cap.
    `datastore`: writes the bundle's static datastore (see DatastoreWriter); None: the bundle has none."""
    precision = precision or fmt.precisions[0]
    check_precision(fmt, precision)
    binding = binding or fmt.binding
    check_binding(fmt, binding)
    if isinstance(max_draft_len, bool) or not isinstance(max_draft_len, int) or max_draft_len < 1:
        raise ConfigError(f"max_draft_len must be an integer >= 1, got {max_draft_len!r}")
    default_pass = max(kv.DEFAULT_MAX_PASS, max_draft_len + 1)
    max_pass = default_pass if max_pass is None else max_pass
    if isinstance(max_pass, bool) or not isinstance(max_pass, int) or max_pass < max_draft_len + 1:
        raise ConfigError(f"max_pass must be an integer >= max_draft_len + 1 = {max_draft_len + 1} (a verify pass "
                          f"carries the last token and every draft), got {max_pass!r}",
                          f"use --max-pass {default_pass}, or lower --max-draft-len")
    cfg = target.config
    max_context = max_context or min(2048, cfg.max_position_embeddings)
    layout = kv_layout(cfg, max_context, max_pass, binding, fmt.fixed_shapes)
    eagle3 = isinstance(drafter, Eagle3Drafter)
    if eagle3:
        aux_layers = check_eagle3_pair(cfg, drafter.cfg, f"the target {target.name}", "the EAGLE-3 drafter")
        if fmt.name not in EAGLE3_FORMATS:
            raise ConfigError(f"EAGLE-3 drafters export to {', '.join(EAGLE3_FORMATS)} bundles only so far, not "
                              f"{fmt.name} (issue 48)",
                              "export with --format onnx, executorch, coreml or qnn, with an MTP drafter (--drafter "
                              "builtin:mtp for a built-in model), or without a drafter")
        sources = {}
    else:
        aux_layers = ()
        sources = pair(target.model, drafter) if drafter is not None else None  # binds a target-derived table
    step = progress or (lambda name: None)

    def build(tmp: Path) -> Manifest:
        step("hashing the target")
        target_id = content_id(cfg.raw, target.model.state_dict())
        graphs, tables = write(ExportJob(tmp, target, drafter, layout, sources, precision, step, max_draft_len,
                                         aux_layers))
        drafter_entry = None
        if eagle3:
            c = drafter.cfg
            drafter_entry = DrafterEntry(
                name=drafter_source or "(in memory)", source=drafter_source,
                content_sha256=content_id(eagle3_config(c), drafter.state_dict()), config=eagle3_config(c),
                target_content_sha256=target_id, candidates_per_step=c.draft_vocab_size, kind=EAGLE3,
                aux_layers=list(aux_layers), draft_vocab_size=c.draft_vocab_size,
                draft_kv=eagle3_layout(c, layout.max_context, layout if fmt.eagle3_state else None).to_json())
        elif drafter is not None:
            drafter_entry = DrafterEntry(
                name=drafter_source or "(in memory)", source=drafter_source,
                content_sha256=content_id(drafter.cfg.raw, drafter.state_dict()), config=drafter.cfg.raw,
                target_content_sha256=target_id, kv_sharing=dict(sources), head_from=drafter.cfg.head_from,
                candidates_per_step=drafter.cfg.candidates_per_step)
        step("copying the tokenizer")
        tokenizer_files = []
        for name in TOKENIZER_FILES:
            src = Path(target.folder) / name
            if src.is_file():
                (tmp / name).write_bytes(src.read_bytes())
                tokenizer_files.append(name)
        tok = target.tokenizer
        datastore_entry = datastore(tmp, target_id) if datastore is not None else None
        step("writing the manifest")
        return Manifest(
            format=fmt.name, precision=precision,
            target=ModelEntry(name=target.name, content_sha256=target_id, config=cfg.raw,
                              source=str(Path(target.folder).resolve())),
            drafter=drafter_entry, layout=layout, binding=binding, vocab_size=cfg.vocab_size,
            hidden_size=cfg.hidden_size, embed_scale=float(target.model.embed_scale),
            bos_token_id=tok.bos_token_id if tok.bos_token_id is not None else cfg.bos_token_id,
            eos_token_ids=tuple(sorted(target.stop_ids)), pad_token_id=cfg.pad_token_id, chat_template=tok.chat_template,
            tokenizer_files=tuple(tokenizer_files), max_draft_len=max_draft_len, graphs=graphs, tables=tables,
            created_by=f"edge-spec {__version__}", datastore=datastore_entry)

    return write_bundle(out, build)


def eagle3_config(cfg: Eagle3Config) -> dict:
    """An eagle3 drafter's config as the manifest records it (and its content id hashes): Speculators' keys."""
    options = ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")
    return {"speculators_model_type": "eagle3", "transformer_layer_config": cfg.layers.raw, "qk_norm": cfg.qk_norm,
            "draft_vocab_size": cfg.draft_vocab_size, "num_aux": cfg.num_aux,
            "eagle_aux_hidden_state_layer_ids": list(cfg.aux_layer_ids) if cfg.aux_layer_ids else None,
            **{name: getattr(cfg, name) for name in options}}


def eagle3_layout(cfg: Eagle3Config, max_context: int, target: kv.KVLayout | None = None) -> kv.KVLayout:
    """An eagle3 drafter's own cache: one full-attention cache per drafter layer, kind kv.DRAFT_KIND, max_context + 1
    slots (slot p - 1 holds its row at position p; rows chained after the committed ones follow). `io` binding, or
    `state` with the target's max_pass beside a `state` target (`target`: its layout; pass it only for a format whose
    programs keep the drafter's cache as their own buffers, Format.eagle3_state: exporters/executorch.py)."""
    c, slots = cfg.layers, max_context + 1
    caches = tuple(kv.CacheSpec(i, kv.DRAFT_KIND, c.kv_heads[0], c.head_dims[0], slots, None)
                   for i in range(c.num_layers))
    if target is not None and target.binding == kv.BINDING_STATE:
        return kv.KVLayout(caches, slots, target.max_pass, kv.BINDING_STATE)
    return kv.KVLayout(caches, slots)
