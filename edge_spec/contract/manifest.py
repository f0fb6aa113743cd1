"""The bundle manifest (`bundle/manifest.json`): the only thing runtimes and demo apps read.

A bundle is a folder: manifest.json + tokenizer files + the format's artifacts (in a folder named after it).
The manifest names every artifact with its sha256, every graph with its ordered IO (name, dtype,
shape with symbolic dims), the KV layout and binding, the drafter's `kv_sharing` (kind -> target
layer), vocabulary and special tokens, chat template, max context, max draft length and precision.

Writing is atomic (edge_spec.contract.atomic.write_bundle: build in a temp sibling folder, write manifest.json
last, then rename), so an interrupted export never leaves a folder that loads. Reading (`read_manifest`)
verifies the schema, every checksum and the drafter/target pairing, and raises `BundleError`
naming the file and the fix.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from edge_spec.errors import BundleError
from edge_spec.contract.formats import FORMATS
from edge_spec.contract.manifest_check import check_fields, check_tables
from edge_spec.contract.datastore_check import DATASTORE_KEY, check_datastore
from edge_spec.contract.kv import (AUX_HIDDEN, BINDING_IO, BINDING_STATE, DRAFT_KIND, OUTPUT_TABLE, TARGET_TABLES,
                                  GraphIO, KVLayout, TensorSpec, aux_size, drafter_io, eagle3_drafter_io, eagle3_fc_io,
                                  has_logit_rows, ring_slots, table_bits, table_specs, target_io)

SCHEMA_VERSION = 2  # 2: the KV layout records `max_pass` (sliding rings sized for it, slot-attention graphs)
READABLE_VERSIONS = (1, 2)  # 1: no cap per forward; its sliding layers use the split attention form
MANIFEST = "manifest.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")  # copied when present
_HASH_CHUNK = 1 << 22


# ---- identities and checksums ------------------------------------------------------------------------
def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def content_id(config: dict, state: dict) -> str:
    """Identity of a model: sha256 over its config (canonical JSON) and every tensor (name, dtype, shape, bytes)."""
    import torch  # only exporters and the eager runtime hash weights

    h = hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode())
    for name in sorted(state):
        t = state[name].detach().contiguous().cpu()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}".encode())
        if t.numel():
            h.update(memoryview(t.view(-1).view(torch.uint8).numpy()))
    return h.hexdigest()


# ---- the manifest ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class GraphEntry:
    file: str  # relative to the bundle root
    precision: str
    io: GraphIO
    method: str | None = None  # the entry point inside `file` (a program's method, a package's function); None: the file
    # fixed-shape artifacts (formats.Format.fixed_shapes): {"lengths": {"T": entry point}, "slots": {kind: cache slots taken}};
    # the io above stays the contract's (symbolic); None: the graph takes the symbolic shapes as they are
    fixed: dict | None = None
    # a file the entry point reads its weights from, relative to the bundle root (an ExecuTorch program's .ptd:
    # every constant once, the program's own and its delegates'); None: `file` holds them
    data: str | None = None

    def to_json(self) -> dict:
        d = {"file": self.file, "precision": self.precision,
             "inputs": [t.to_json() for t in self.io.inputs], "outputs": [t.to_json() for t in self.io.outputs]}
        return d | ({"method": self.method} if self.method else {}) | ({"fixed": self.fixed} if self.fixed else {}) \
            | ({"data": self.data} if self.data else {})

    @staticmethod
    def from_json(d: dict) -> "GraphEntry":
        io = GraphIO(tuple(TensorSpec.from_json(t) for t in d["inputs"]),
                     tuple(TensorSpec.from_json(t) for t in d["outputs"]))
        return GraphEntry(d["file"], d["precision"], io, d.get("method"), d.get("fixed"), d.get("data"))


@dataclass(frozen=True)
class TableEntry:
    """A raw little-endian array shared by several graphs (bound as an input / initializer, never copied)."""

    file: str
    dtype: str
    shape: tuple[int, ...]

    def to_json(self) -> dict:
        return {"file": self.file, "dtype": self.dtype, "shape": list(self.shape)}

    @staticmethod
    def from_json(d: dict) -> "TableEntry":
        return TableEntry(d["file"], d["dtype"], tuple(int(x) for x in d["shape"]))


@dataclass(frozen=True)
class ModelEntry:
    name: str  # what the user passed (built-in name or folder)
    content_sha256: str  # content_id of config + weights
    config: dict  # the checkpoint's config.json
    source: str | None = None  # folder to reload eager weights from (runtime "torch"); None if exported from memory


MTP, EAGLE3 = "mtp", "eagle3"  # drafter kinds: reads the target's caches | reads its aux states, owns a cache
EAGLE3_FORMATS = ("onnx", "executorch", "coreml", "qnn")  # formats whose exporter and runtime build eagle3 drafters (issue 48)
# ... and whose native runner (runtimes/native: the phone apps) runs them too (its manifest.cpp verify_eagle3)
NATIVE_EAGLE3_FORMATS = ("onnx", "executorch", "qnn", "coreml")  # Core ML: the backend built for Apple platforms only
EAGLE3_FC_GRAPH = "drafter_fc"  # an eagle3 bundle's fc graph (kv.eagle3_fc_io) beside its "drafter" graph


@dataclass(frozen=True)
class DrafterEntry(ModelEntry):
    target_content_sha256: str = ""  # the target it was exported against
    kv_sharing: dict = field(default_factory=dict)  # kind -> target layer whose cache it reads
    head_from: str = "drafter"
    candidates_per_step: int = 0
    kind: str = MTP  # MTP (absent from the JSON) | EAGLE3; the fields below are eagle3's only (absent for MTP)
    aux_layers: list = field(default_factory=list)  # target layer ids whose residual streams it reads (AUX_HIDDEN)
    draft_vocab_size: int = 0  # Vd: its candidates per step
    draft_kv: dict | None = None  # its own cache: a KVLayout (kind kv.DRAFT_KIND, `io` binding) as JSON

    @property
    def draft_layout(self) -> KVLayout:
        return KVLayout.from_json(self.draft_kv)


@dataclass(frozen=True)
class Manifest:
    format: str  # a registered format's name (edge_spec.contract.formats)
    precision: str  # one of the format's precisions
    target: ModelEntry
    drafter: DrafterEntry | None
    layout: KVLayout
    binding: str
    vocab_size: int
    hidden_size: int
    embed_scale: float
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    pad_token_id: int | None
    chat_template: str | None
    tokenizer_files: tuple[str, ...]
    max_draft_len: int
    graphs: dict[str, GraphEntry]  # "target", "drafter"
    tables: dict[str, TableEntry]  # kv.EMBED_TABLE, kv.OUTPUT_TABLE
    files: dict[str, dict] = field(default_factory=dict)  # relative path -> {"sha256", "bytes"}
    created_by: str = ""
    datastore: dict | None = None  # optional: a static datastore file (edge_spec.contract.datastore_check)

    @property
    def max_context(self) -> int:
        return self.layout.max_context

    def to_json(self) -> dict:
        d = {"schema_version": SCHEMA_VERSION, "created_by": self.created_by, "format": self.format,
             "precision": self.precision,
             "target": _model_json(self.target), "drafter": _model_json(self.drafter) if self.drafter else None,
             "vocab_size": self.vocab_size, "hidden_size": self.hidden_size, "embed_scale": self.embed_scale,
             "tokenizer": {"files": list(self.tokenizer_files), "bos_token_id": self.bos_token_id,
                           "eos_token_ids": list(self.eos_token_ids), "pad_token_id": self.pad_token_id,
                           "chat_template": self.chat_template},
             "max_context": self.max_context, "max_draft_len": self.max_draft_len,
             "kv": {"binding": self.binding, "layout": self.layout.to_json()},
             "graphs": {k: g.to_json() for k, g in self.graphs.items()},
             "tables": {k: t.to_json() for k, t in self.tables.items()},
             "files": self.files}
        return d | ({DATASTORE_KEY: self.datastore} if self.datastore is not None else {})

    @staticmethod
    def from_json(d: dict) -> "Manifest":
        tok = d["tokenizer"]
        drafter = d.get("drafter")
        return Manifest(
            format=d["format"], precision=d["precision"], target=ModelEntry(**d["target"]),
            drafter=DrafterEntry(**drafter) if drafter else None,
            layout=KVLayout.from_json(d["kv"]["layout"]), binding=d["kv"]["binding"], vocab_size=int(d["vocab_size"]),
            hidden_size=int(d["hidden_size"]), embed_scale=float(d["embed_scale"]), bos_token_id=tok["bos_token_id"],
            eos_token_ids=tuple(tok["eos_token_ids"]), pad_token_id=tok["pad_token_id"],
            chat_template=tok["chat_template"], tokenizer_files=tuple(tok["files"]),
            max_draft_len=int(d["max_draft_len"]),
            graphs={k: GraphEntry.from_json(g) for k, g in d["graphs"].items()},
            tables={k: TableEntry.from_json(t) for k, t in d["tables"].items()},
            files=dict(d["files"]), created_by=d.get("created_by", ""), datastore=d.get(DATASTORE_KEY))


_EAGLE3_FIELDS = ("kind", "aux_layers", "draft_vocab_size", "draft_kv")


def _model_json(m: ModelEntry) -> dict:
    d = dict(m.__dict__)
    if isinstance(m, DrafterEntry) and m.kind == MTP:  # MTP manifests stay as they were before eagle3
        d = {k: v for k, v in d.items() if k not in _EAGLE3_FIELDS}
    return d


# ---- reading (verified) ------------------------------------------------------------------------------
_REEXPORT = "re-run `edge-spec export` into a fresh --out folder"


def read_manifest(folder: str | Path, *, verify_checksums: bool = True) -> Manifest:
    """Load and verify a bundle's manifest: schema, file sizes and sha256, the graph IO the manifest records vs
    the KV contract, and the drafter/target pairing. Raises BundleError saying which file or field is wrong.
    (Each runtime then checks the graph files' own IO against the manifest when it loads them: the ORT backend's
    `check_graph_io`.)"""
    folder = Path(folder).expanduser()
    if folder.is_file():
        raise BundleError(f"{folder} is a file, not a bundle folder", "pass the --out folder of `edge-spec export`")
    if not folder.is_dir():
        raise BundleError(f"bundle folder {folder} does not exist", "pass the --out folder of `edge-spec export`")
    path = folder / MANIFEST
    if not path.is_file():
        raise BundleError(f"{path} is missing: {folder} is not a bundle (or its export was interrupted)", _REEXPORT)
    try:
        raw = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise BundleError(f"{path} is not valid JSON ({err})", _REEXPORT) from err
    version = raw.get("schema_version") if isinstance(raw, dict) else None
    if version not in READABLE_VERSIONS:
        raise BundleError(f"{path}: schema_version {version!r}, this edge-spec reads versions "
                          f"{', '.join(map(str, READABLE_VERSIONS))}",
                          "re-export the bundle with this edge-spec version (or install the version that wrote it)")
    check_fields(raw, path)
    try:
        manifest = Manifest.from_json(raw)
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise BundleError(f"{path}: missing or malformed field {err}", _REEXPORT) from err
    _verify_files(folder, manifest, verify_checksums)
    check_datastore(manifest.datastore, manifest.files, path)
    check_tables(manifest, path)
    _verify_contract(manifest, path)
    return manifest


def _verify_files(folder: Path, m: Manifest, checksums: bool) -> None:
    for rel, entry in m.files.items():
        if Path(rel).is_absolute() or ".." in Path(rel).parts:
            raise BundleError(f"{folder / MANIFEST}: file entry {rel!r} points outside the bundle", _REEXPORT)
        if not isinstance(entry, dict) or not {"sha256", "bytes"} <= entry.keys():
            raise BundleError(f"{folder / MANIFEST}: file entry {rel!r} lacks sha256/bytes", _REEXPORT)
    referenced = [g.file for g in m.graphs.values()] + [g.data for g in m.graphs.values() if g.data] + \
        [t.file for t in m.tables.values()] + list(m.tokenizer_files)
    for rel in referenced:  # a file, or a folder artifact (an .mlpackage) whose files are all listed
        if rel not in m.files and not any(f.startswith(rel + "/") for f in m.files):
            raise BundleError(f"{folder / MANIFEST}: {rel} is used but has no checksum entry", _REEXPORT)
    for rel, entry in m.files.items():
        path = folder / rel
        if not path.is_file():
            raise BundleError(f"{path} is missing from the bundle", "copy the whole bundle folder, or " + _REEXPORT)
        size = path.stat().st_size
        if size != entry["bytes"]:
            raise BundleError(f"{path} is truncated or altered: {size} bytes, the manifest says {entry['bytes']}",
                              "copy the file again from the original bundle, or " + _REEXPORT)
        if checksums and sha256_file(path) != entry["sha256"]:
            raise BundleError(f"{path} is corrupt: its sha256 does not match the manifest",
                              "copy the file again from the original bundle, or " + _REEXPORT)


def _verify_contract(m: Manifest, path: Path) -> None:
    fmt = FORMATS.get(m.format)
    if fmt is None:
        raise BundleError(f"{path}: format {m.format!r} is not one this edge-spec reads ({', '.join(FORMATS)})",
                          "update edge-spec, or re-export the bundle with --format " + "|".join(FORMATS))
    if m.binding not in fmt.bindings or m.layout.binding != m.binding:
        raise BundleError(f"{path}: KV binding {m.binding!r} (layout {m.layout.binding!r}) is not one the "
                          f"{m.format} format uses ({', '.join(fmt.bindings)})", _REEXPORT)
    if m.precision not in fmt.precisions:
        raise BundleError(f"{path}: unknown precision {m.precision!r} for the {m.format} format", _REEXPORT)
    if "target" not in m.graphs:
        raise BundleError(f"{path}: the bundle has no target graph", _REEXPORT)
    if m.layout.max_pass is not None:
        if m.max_draft_len + 1 > m.layout.max_pass:
            raise BundleError(f"{path}: max_draft_len {m.max_draft_len} needs verify passes of {m.max_draft_len + 1} "
                              f"tokens, more than the layout's max_pass {m.layout.max_pass}", _REEXPORT)
        for c in m.layout.caches:
            if c.window and c.slots < ring_slots(c.window, m.layout.max_context, m.layout.max_pass, m.binding):
                raise BundleError(f"{path}: layer {c.layer}'s ring has {c.slots} slots, too few for window {c.window} "
                                  f"and passes of {m.layout.max_pass} tokens", _REEXPORT)
    target = m.graphs["target"].io  # with or without LOGIT_ROWS (ONNX bundles before 2026-12-05: without)
    _check_aux(m, target, path)
    _same_io(f"{path}: target graph", target,
             target_io(m.layout, m.vocab_size, m.hidden_size, has_logit_rows(target), aux_size(target)))
    if m.drafter is None:
        if "drafter" in m.graphs:
            raise BundleError(f"{path}: a drafter graph is listed without a drafter entry", _REEXPORT)
        return
    d = m.drafter
    if d.target_content_sha256 != m.target.content_sha256:  # either kind (eagle3 ones skipped it until 2026-12-07)
        raise BundleError(f"{path}: the drafter was exported for target {d.target_content_sha256[:12]}, "
                          f"this bundle's target is {m.target.content_sha256[:12]} (a drafter from another target)",
                          "export the drafter together with its own target: edge-spec export --model M --drafter D")
    if d.kind == EAGLE3:
        _verify_eagle3(m, path)
        return
    cached = {c.layer: c for c in m.layout.caches}
    for kind, layer in d.kv_sharing.items():
        spec = cached.get(int(layer))
        if spec is None or spec.kind != kind:
            raise BundleError(f"{path}: drafter kv_sharing {kind} -> layer {layer}, but the target has no cached "
                              f"{kind} layer {layer}", "pair the drafter with the target it was trained for")
    if "drafter" not in m.graphs:
        raise BundleError(f"{path}: the drafter entry has no drafter graph", _REEXPORT)
    expected = drafter_io(m.layout, {k: int(v) for k, v in d.kv_sharing.items()}, m.vocab_size, m.hidden_size,
                          d.candidates_per_step, output_table=OUTPUT_TABLE in m.tables, tables=not fmt.constant_tables,
                          table_bits=table_bits(m.tables))
    _same_io(f"{path}: drafter graph", m.graphs["drafter"].io, expected)


def _check_aux(m: Manifest, target: GraphIO, path: Path) -> None:
    """The target graph returns AUX_HIDDEN exactly when the drafter is an eagle3 one, as wide as its aux layers."""
    kind = m.drafter.kind if m.drafter is not None else None
    if kind not in (None, MTP, EAGLE3):
        raise BundleError(f"{path}: drafter kind {kind!r} is not one this edge-spec runs ({MTP}, {EAGLE3})",
                          "update edge-spec, or " + _REEXPORT)
    got = aux_size(target)
    need = len(m.drafter.aux_layers) * m.hidden_size if kind == EAGLE3 else 0
    if need and not got:
        raise BundleError(f"{path}: the eagle3 drafter reads the target's hidden states at layers "
                          f"{list(m.drafter.aux_layers)}, but the target graph has no {AUX_HIDDEN} output",
                          "re-export the pair with this edge-spec: edge-spec export --model M --drafter EAGLE3_FOLDER "
                          "(the target graph then returns them)")
    if got != need:
        has = f"an eagle3 drafter reading {need // m.hidden_size} aux layers" if need else "no eagle3 drafter"
        raise BundleError(f"{path}: the target graph returns {AUX_HIDDEN} of width {got}, but the bundle has {has} "
                          f"(width {need})", _REEXPORT)


def _verify_eagle3(m: Manifest, path: Path) -> None:
    """An eagle3 drafter: a format that runs it, no kv_sharing, its own `io` cache layout, its two graphs' IO."""
    d = m.drafter
    if m.format not in EAGLE3_FORMATS:
        raise BundleError(f"{path}: an eagle3 drafter in a {m.format} bundle; edge-spec runs eagle3 drafters in "
                          f"{', '.join(EAGLE3_FORMATS)} bundles only so far",
                          "re-export with --format onnx, executorch, coreml or qnn")
    if d.kv_sharing or not d.draft_kv or not 0 < d.draft_vocab_size <= m.vocab_size:
        raise BundleError(f"{path}: the eagle3 drafter entry needs draft_kv, draft_vocab_size in [1, {m.vocab_size}] "
                          f"and no kv_sharing", _REEXPORT)
    try:
        draft = d.draft_layout
    except (KeyError, TypeError, ValueError) as err:
        raise BundleError(f"{path}: the eagle3 drafter's draft_kv is malformed ({err})", _REEXPORT) from err
    # a program keeps both caches, or neither (Format.eagle3_state); else the drafter's stays `io`
    keeps = m.layout.binding == BINDING_STATE and FORMATS[m.format].eagle3_state
    binding = BINDING_STATE if keeps else BINDING_IO
    if draft.binding != binding or draft.kinds() != (DRAFT_KIND,) or draft.max_context <= m.max_context:
        raise BundleError(f"{path}: the eagle3 drafter's cache layout must be `{binding}` (a {m.format} bundle's with "
                          f"a `{m.layout.binding}` target), kind {DRAFT_KIND!r}, with more slots than max_context "
                          f"{m.max_context}", _REEXPORT)
    for name in ("drafter", EAGLE3_FC_GRAPH):
        if name not in m.graphs:
            raise BundleError(f"{path}: the eagle3 drafter entry has no {name!r} graph", _REEXPORT)
    io = m.graphs["drafter"].io
    shared = any(t.name in TARGET_TABLES for t in io.inputs)  # it gathers the target's table (else keeps its own)
    tables = table_specs(m.vocab_size, m.hidden_size, table_bits(m.tables)) if shared else []
    _same_io(f"{path}: drafter graph", io, eagle3_drafter_io(draft, m.hidden_size, d.draft_vocab_size, tuple(tables)))
    _same_io(f"{path}: {EAGLE3_FC_GRAPH} graph", m.graphs[EAGLE3_FC_GRAPH].io,
             eagle3_fc_io(len(d.aux_layers) * m.hidden_size, m.hidden_size))


def _same_io(where: str, got: GraphIO, want: GraphIO) -> None:
    for role, a, b in (("input", got.inputs, want.inputs), ("output", got.outputs, want.outputs)):
        if len(a) != len(b):
            raise BundleError(f"{where} has {len(a)} {role}s, the KV contract expects {len(b)}", _REEXPORT)
        for i, (x, y) in enumerate(zip(a, b)):
            if x != y:
                raise BundleError(f"{where} {role} {i} is {x.name} {x.dtype}{list(x.shape)}, the KV contract "
                                  f"expects {y.name} {y.dtype}{list(y.shape)}", _REEXPORT)


def read_table(folder: Path, entry: TableEntry) -> np.ndarray:
    """Memory-map a shared table (read-only; every graph that needs it binds this one buffer)."""
    return np.memmap(Path(folder) / entry.file, dtype=np.dtype(entry.dtype).newbyteorder("<"), mode="r",
                     shape=entry.shape)
