"""CLI subcommands for drafters: `train-drafter` and `eval-drafter` (registered into edge_spec.cli)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def add_parsers(sub: argparse._SubParsersAction) -> None:
    tr = sub.add_parser("train-drafter", help="train an MTP drafter (default) or an EAGLE-3 drafter (--arch eagle3) "
                                              "for a target (distillation from its hidden states)")
    tr.add_argument("--arch", choices=["mtp", "eagle3"], default="mtp",
                    help="mtp: edge-spec's own drafter (docs/drafter.md); eagle3: an EAGLE-3 drafter written as a "
                         "Speculators folder (config.json + model.safetensors) that generate / eval-drafter / "
                         "export --format onnx take as --drafter (docs/training.md, 'EAGLE-3 drafters')")
    tr.add_argument("--target", default="smollm2-135m", help="built-in name or HF folder of the target")
    tr.add_argument("--data", nargs="+", default=["debian-docs", "stdlib", "chat"],
                    help="built-in sources (debian-docs, stdlib, chat, everyday: answers to everyday questions) and/or "
                         "text folders and files (a .txt file by itself is a corpus: cut into pieces, 5%% held out)")
    tr.add_argument("--out", required=True, help="drafter folder to write (work files go to OUT.work/)")
    tr.add_argument("--work", default=None, help="cache folder for corpora/shards/checkpoints (default OUT.work)")
    tr.add_argument("--max-tokens", type=int, default=400_000, help="training tokens (regenerated chat included)")
    tr.add_argument("--regenerated", default=None,
                    help="a folder of committed regenerated answers (token ids, no text): answers found there are not "
                         "generated again, and this run's are written back to it")
    tr.add_argument("--max-chat-prompts", type=int, default=None, help="limit regenerated chat prompts")
    tr.add_argument("--chat-templates", type=int, default=2,
                    help="chat prompt templates per topic (1-8; more = more regenerated chat answers)")
    tr.add_argument("--regen-text", type=int, default=200, help="document openings the target continues (regenerated)")
    tr.add_argument("--regen-tokens", type=int, default=128, help="new tokens per regenerated answer/continuation")
    tr.add_argument("--regen-batch", type=int, default=16, help="prompts generated at once (bf16 CPU sweet spot: 16)")
    tr.add_argument("--epochs", type=float, default=1.0)
    tr.add_argument("--max-steps", type=int, default=None, help="stop after this many optimiser steps")
    tr.add_argument("--minutes", type=float, default=None,
                    help="stop training after this many minutes (a chunk): the checkpoint, the drafter so far and its "
                         "report are written; the same command again continues the run from the checkpoint")
    tr.add_argument("--stop-after", choices=["regenerate"], default=None,
                    help="end the run after a stage (a chunk): `regenerate` writes the target's answers to the work "
                         "folder and --regenerated, then exits; the same command without it goes on from there")
    tr.add_argument("--optimizer", choices=["adamw", "muon"], default="adamw")
    tr.add_argument("--lr", type=float, default=None, help="peak learning rate (default: mtp 2e-3, eagle3 1e-3)")
    tr.add_argument("--batch-seqs", type=int, default=4, help="sequences of 256 tokens per step")
    tr.add_argument("--steps-ahead", type=int, default=3,
                    help="MTP depth / EAGLE-3 training-time-test steps trained (the drafter feeds itself back)")
    tr.add_argument("--hidden-size", type=int, default=None,
                    help="mtp only: the drafter's width (default 256; an EAGLE-3 drafter is as wide as its target)")
    tr.add_argument("--layers", type=int, default=None, help="decoder layers (default: mtp 2, eagle3 1)")
    tr.add_argument("--heads", type=int, default=None,
                    help="query heads per layer (default: hidden size / the target's head dim, at least its KV heads)")
    tr.add_argument("--intermediate-size", type=int, default=None,
                    help="MLP width (default: mtp 1024, eagle3 the target's)")
    tr.add_argument("--centroids", type=int, default=None, help="mtp only: vocabulary clusters (default 1024)")
    tr.add_argument("--top-k-clusters", type=int, default=None, help="mtp only (default 32)")
    tr.add_argument("--head-from", choices=["target", "drafter"], default=None,
                    help="mtp only: score tokens with the target's own output embedding (default: target) or a "
                         "table of the drafter's")
    tr.add_argument("--table-from", choices=["own", "target"], default=None,
                    help="mtp only, with --head-from drafter: the drafter's table stored (own, the default) or derived "
                         "from the target's embedding through a learned projection (target: the checkpoint stores the "
                         "projection only)")
    tr.add_argument("--draft-vocab", type=int, default=None,
                    help="eagle3 only: draft vocabulary size, the most frequent target tokens of the training data "
                         "(default: min(target vocabulary, 32000); the whole vocabulary = no d2t / t2d map)")
    tr.add_argument("--aux-layers", type=int, nargs="+", default=None,
                    help="eagle3 only: the target layers whose input streams the drafter reads (id L: the stream "
                         "leaving the last of L layers; default: Speculators' 2, L // 2, L - 3)")
    tr.add_argument("--save-dtype", choices=["float32", "bfloat16"], default="float32",
                    help="dtype of the written weights (bfloat16: half the bytes; read back as float32)")
    tr.add_argument("--seed", type=int, default=0)
    tr.add_argument("--init", default=None,
                    help="start from this drafter instead of a fresh one; its shape wins ('builtin': the target's "
                         "shipped drafter of --arch's family; or a drafter folder: mtp, or a Speculators eagle3 "
                         "folder, its aux layers and vocabulary too)")
    tr.add_argument("--shard-bits", type=int, choices=[16, 4], default=None,
                    help="mtp only: teacher activations on disk: fp16 (16, the default), or 4-bit codes after a "
                         "Hadamard rotation (3.8x smaller)")
    tr.add_argument("--vocab-sample", type=int, default=None,
                    help="mtp only: uniform negatives of the sampled-softmax loss (default 4096; 0 = full vocabulary, "
                         "~3x slower)")
    tr.add_argument("--fp32", action="store_true",
                    help="train in fp32, no bf16 autocast (which is used only where a timed probe finds bf16 "
                         "at least 2x faster than fp32: a GPU, a CPU with bf16 units); ranks then agree with one "
                         "process to fp32 rounding, not bf16's")
    tr.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                    help="where the teacher pass and training run (auto: cuda when torch sees a GPU). Under torchrun "
                         "(docs/training.md) every rank takes its share of --batch-seqs, which must be a multiple of "
                         "the number of ranks")

    ev = sub.add_parser("eval-drafter", help="speculative generation over JSONL prompts: tau, acceptance by position")
    ev.add_argument("--model", default="smollm2-135m")
    ev.add_argument("--drafter", default="builtin", help="'builtin' or a drafter folder")
    ev.add_argument("--prompts", default=None, help="JSONL prompts (default: the shipped held-out set)")
    ev.add_argument("--max-new-tokens", type=int, default=128)
    ev.add_argument("--spec-k", type=int, nargs="+", default=[4], help="one or more k values")
    ev.add_argument("--temperature", type=float, nargs="+", default=[0.0], help="one or more temperatures")
    ev.add_argument("--json", default=None, help="write the results (a list, one object per k x temperature)")
    ev.add_argument("--threads", type=int, default=None)
    ev.add_argument("--bundle", default=None,
                    help="evaluate an exported bundle's target + drafter with onnxruntime instead (much faster on CPU)")
    ev.add_argument("--no-spin", action="store_true", help="with --bundle: idle onnxruntime threads sleep (shared cores)")
    ev.add_argument("--provider", default=None,
                    help="with --bundle: the execution provider, as `generate --provider` takes it for the bundle's "
                         "format (a qnn bundle: cpu runs its QDQ graphs, much faster than the simulated HTP here)")
    ev.add_argument("--lookup", action="store_true",
                    help="hybrid drafting: retrieval first, the drafter when nothing matches (default: the drafter alone)")
    ev.add_argument("--datastore", action="store_true",
                    help="the static datastore drafts (after --lookup's retrieval) before the drafter, where the model "
                         "or bundle has one (edge_spec.decoding.datastore)")
    ev.add_argument("--no-mtp", dest="mtp", action="store_false",
                    help="the drafter model never drafts: --lookup and / or --datastore alone (a pass with no retrieval "
                         "draft is a plain step), to measure what each draft source gives")
    ev.add_argument("--fixed-k", dest="adaptive", action="store_false",
                    help="draft exactly --spec-k tokens every pass (default: adaptive k, as generate)")
    ev.add_argument("--teacher-forced", action="store_true",
                    help="eager, greedy: also score the drafter on every generated position fed the true tokens, as "
                         "training sees it (a live acceptance far below it would mean a train/inference mismatch)")


def cmd_train(args: argparse.Namespace) -> int:
    """One process, or one rank of those torchrun started (RANK / WORLD_SIZE in the environment): rank 0 prints."""
    from edge_spec.train.dist import launched

    check_arch_options(args)  # before any process group or device is set up
    with launched(args.device) as dist:
        report = _train(args, dist)
        if dist.main:
            keys = ("stopped_after", "steps", "total_steps", "world_size", "device", "data", "drafter", "held_out",
                    "total_seconds")
            print(json.dumps({k: report[k] for k in keys if k in report}, indent=2, default=float))
            if "stopped_after" in report:
                print(f"stopped after {report['stopped_after']}: run the same command without --stop-after to go on",
                      file=sys.stderr)
            else:
                print(f"drafter written to {args.out}", file=sys.stderr)
    return 0


MTP_ONLY = {"hidden_size": "--hidden-size", "centroids": "--centroids", "top_k_clusters": "--top-k-clusters",
            "head_from": "--head-from", "table_from": "--table-from", "shard_bits": "--shard-bits",
            "vocab_sample": "--vocab-sample"}
EAGLE3_ONLY = {"draft_vocab": "--draft-vocab", "aux_layers": "--aux-layers"}
MTP_DEFAULTS = {"lr": 2e-3, "layers": 2, "intermediate_size": 1024, "hidden_size": 256, "centroids": 1024,
                "top_k_clusters": 32, "head_from": "target", "table_from": "own", "shard_bits": 16,
                "vocab_sample": 4096}


def check_arch_options(args: argparse.Namespace) -> None:
    """Options of the other architecture are refused by name (a silently ignored option is a wrong run)."""
    from edge_spec.errors import ConfigError

    other = MTP_ONLY if args.arch == "eagle3" else EAGLE3_ONLY
    given = [flag for name, flag in other.items() if getattr(args, name, None) is not None]
    if given:
        kind = "an MTP drafter's" if args.arch == "eagle3" else "an EAGLE-3 drafter's"
        raise ConfigError(f"{', '.join(given)} set{'s' if len(given) == 1 else ''} {kind} shape or training, not "
                          f"--arch {args.arch}'s", f"drop {' '.join(given)}, or pass --arch "
                          f"{'mtp' if args.arch == 'eagle3' else 'eagle3'}")
    if args.init is not None and (args.init == "builtin" or args.init.startswith("builtin:")):
        from edge_spec.api import resolve_drafter  # the shipped drafter of --arch's family, as a folder
        family = args.init.partition(":")[2] or args.arch
        if family != args.arch:
            raise ConfigError(f"--init {args.init} is an {family} drafter, not an --arch {args.arch} one",
                              f"pass --init builtin:{args.arch}, a drafter folder of that family, or drop --init")
        args.init = str(resolve_drafter(f"builtin:{args.arch}", args.target))


def _train(args: argparse.Namespace, dist) -> dict:
    check_arch_options(args)
    if args.arch == "eagle3":
        return _train_eagle3(args, dist)
    for name, value in MTP_DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    return _train_mtp(args, dist)


def _train_eagle3(args: argparse.Namespace, dist) -> dict:
    import torch

    from edge_spec.errors import ConfigError
    from edge_spec.loading.checkpoints import load
    from edge_spec.loading.speculators_eagle3 import is_eagle3_folder
    from edge_spec.train.eagle3_pipeline import run_eagle3
    from edge_spec.train.eagle3_trainer import Eagle3TrainConfig

    if args.init and not is_eagle3_folder(args.init):
        raise ConfigError(f"--init {args.init} is not a Speculators eagle3 folder (no config.json with "
                          "speculators_model_type 'eagle3')", "pass an EAGLE-3 drafter folder, or drop --init")
    cfg = Eagle3TrainConfig(steps_ahead=args.steps_ahead, optimizer=args.optimizer,
                            lr=args.lr if args.lr is not None else 1e-3, batch_seqs=args.batch_seqs,
                            epochs=args.epochs, seed=args.seed, bf16=not args.fp32)
    return run_eagle3(load(args.target), Path(args.out), data=args.data, max_tokens=args.max_tokens,
                      max_chat_prompts=args.max_chat_prompts, chat_templates=args.chat_templates,
                      max_regen_text=args.regen_text, chat_max_new=args.regen_tokens, chat_batch=args.regen_batch,
                      num_layers=args.layers or 1, num_heads=args.heads, intermediate_size=args.intermediate_size,
                      draft_vocab=args.draft_vocab, aux_layers=args.aux_layers, train_cfg=cfg,
                      max_steps=args.max_steps, work=Path(args.work) if args.work else None,
                      init=Path(args.init) if args.init else None, save_dtype=getattr(torch, args.save_dtype),
                      minutes=args.minutes, regenerated=Path(args.regenerated) if args.regenerated else None,
                      dist=dist, stop_after=args.stop_after)


def _train_mtp(args: argparse.Namespace, dist) -> dict:
    import torch

    from edge_spec.loading.checkpoints import load
    from edge_spec.train.pipeline import run
    from edge_spec.train.trainer import TrainConfig

    cfg = TrainConfig(steps_ahead=args.steps_ahead, optimizer=args.optimizer, lr=args.lr, batch_seqs=args.batch_seqs,
                      epochs=args.epochs, seed=args.seed, vocab_sample=args.vocab_sample,
                      bf16=not args.fp32)
    init = None
    if args.init:
        init = Path(args.init).expanduser()  # 'builtin' was resolved to its folder by check_arch_options
    report = run(load(args.target), Path(args.out), data=args.data, max_tokens=args.max_tokens,
                 max_chat_prompts=args.max_chat_prompts, chat_templates=args.chat_templates,
                 max_regen_text=args.regen_text, chat_max_new=args.regen_tokens,
                 chat_batch=args.regen_batch, hidden_size=args.hidden_size, num_layers=args.layers, num_heads=args.heads,
                 intermediate_size=args.intermediate_size, num_centroids=args.centroids,
                 top_k_clusters=args.top_k_clusters, head_from=args.head_from, table_from=args.table_from,
                 train_cfg=cfg, max_steps=args.max_steps,
                 work=Path(args.work) if args.work else None, init=init, shard_bits=args.shard_bits,
                 save_dtype=getattr(torch, args.save_dtype), minutes=args.minutes,
                 regenerated=Path(args.regenerated) if args.regenerated else None, dist=dist,
                 stop_after=args.stop_after)
    return report


def cmd_eval(args: argparse.Namespace) -> int:
    from edge_spec.api import load
    from edge_spec.errors import ConfigError
    from edge_spec.train.evaluate import DEFAULT_PROMPTS, evaluate, read_prompts

    prompts = read_prompts(Path(args.prompts) if args.prompts else DEFAULT_PROMPTS)
    if args.provider and not args.bundle:
        raise ConfigError("--provider picks a bundle runtime's execution provider", "add --bundle B, or drop --provider")
    if args.bundle:
        engine = load(bundle=args.bundle, threads=args.threads, spin=not args.no_spin,
                      **({"provider": args.provider} if args.provider else {}))
        if engine.drafter is None:
            raise ConfigError(f"bundle {args.bundle} has no drafter", "export it with --drafter builtin (or PATH)")
    else:
        engine = load(args.model, drafter=args.drafter, threads=args.threads)
    if args.datastore and engine.datastore is None:
        raise ConfigError("--datastore: this model or bundle has no static datastore",
                          "export the bundle from a checkout that has data/regenerated/<target>, or drop --datastore")
    if not args.mtp and not (args.lookup or args.datastore):
        raise ConfigError("--no-mtp leaves no draft source", "add --lookup and / or --datastore")
    if not args.mtp and args.teacher_forced:
        raise ConfigError("--teacher-forced scores the drafter model, which --no-mtp turns off", "drop one of them")
    results = []
    for temperature in args.temperature:
        for k in args.spec_k:
            r = evaluate(engine, prompts, k=k, temperature=temperature, max_new_tokens=args.max_new_tokens,
                         teacher_forced=args.teacher_forced, lookup=args.lookup, datastore=args.datastore,
                         adaptive=args.adaptive, mtp=args.mtp)
            r.update(runtime=engine.runtime, precision=engine.manifest.precision if engine.manifest else "fp32",
                     drafter=engine.manifest.drafter.name if engine.manifest else args.drafter)
            results.append(r)
            acc = " ".join("-" if a is None else f"{a:.2f}" for a in r["acceptance_by_position"])
            kinds = " ".join(f"{name}={v['tau']:.2f}" for name, v in sorted(r["by_kind"].items()))
            tf = ""
            if "teacher_forced_by_position" in r:
                tf = " | teacher-forced [" + " ".join(f"{a:.2f}" for a in r["teacher_forced_by_position"] if a is not None) + "]"
            print(f"k={k} T={temperature}: tau {r['tau']:.2f} | accept by pos [{acc}]{tf} | by kind: {kinds}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


COMMANDS = {"train-drafter": cmd_train, "eval-drafter": cmd_eval}
