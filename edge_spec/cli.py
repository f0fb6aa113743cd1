"""`edge-spec` command line. Errors the user can fix print one line (`error: ...`) and exit 2."""

from __future__ import annotations

import argparse
import sys

from edge_spec import cli_options
from edge_spec.errors import EdgeSpecError
from edge_spec.contract import formats
from edge_spec.contract.formats import CHECK, EXPORT, RUN
from edge_spec.contract.kv import BINDING_IO, BINDING_SHARED, BINDING_STATE

EXIT_USER_ERROR = 2


def _add_sampling(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-new-tokens", type=int, default=128, help="tokens to generate (default 128)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (0 = off)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (1 = off)")
    p.add_argument("--seed", type=int, default=None, help="random seed for sampling")


def _add_spec(p: argparse.ArgumentParser) -> None:
    p.add_argument("--drafter", default=None,
                   help="'builtin' or a drafter folder: enables speculative decoding (default: none, plain decoding)")
    p.add_argument("--spec-k", type=int, default=None,
                   help="draft tokens per target pass, the maximum with --adaptive (default 4, or a bundle's "
                        "--max-draft-len when smaller)")
    p.add_argument("--adaptive", action="store_true", default=True,
                   help="(default) choose k <= --spec-k per pass from costs measured at run time (k = 0, plain, "
                        "when that is faster); stop drafting at low confidence")
    p.add_argument("--fixed-k", dest="adaptive", action="store_false",
                   help="draft exactly --spec-k tokens every pass instead of letting the cost model choose")
    p.add_argument("--min-confidence", type=float, default=0.3,
                   help="adaptive mode: end a burst when the drafter's probability of its draft is below this")
    p.add_argument("--no-spec", action="store_true", help="plain decoding even when a drafter is loaded")
    p.add_argument("--no-lookup", dest="lookup", action="store_false",
                   help="draft with the MTP drafter only (default: retrieval first - the continuation of the text's "
                        "latest earlier occurrence of its recent words - and the drafter when nothing matches)")
    p.add_argument("--no-datastore", dest="datastore", action="store_false",
                   help="no static datastore drafting (default: after prompt lookup, the continuation of the text's "
                        "recent words in the target's own earlier answers, where the bundle or model has a datastore)")


DEFAULT_MODEL = "smollm2-135m"


def _add_model(p: argparse.ArgumentParser, native: bool = False) -> None:
    p.add_argument("--model", default=None,
                   help="built-in name (smollm2-135m, gemma3-270m) or a Hugging Face checkpoint folder (default smollm2-135m)")
    p.add_argument("--bundle", default=None,
                   help="an exported bundle folder (edge-spec export) instead of --model; speculative by default "
                        "when it has a drafter (--no-spec for plain)")
    p.add_argument("--runtime", default=None, choices=list(formats.runtimes()) + (["native"] if native else []),
                   help=cli_options.runtime_help() + ("; native: the C++ runner (make native) on "
                                                      f"{'/'.join(formats.native_formats())} bundles" if native else ""))
    cli_options.add_format_options(p, RUN)
    p.add_argument("--max-context", type=int, default=None,
                   help="KV cache size in tokens (default min(2048, model max); a bundle's own by default)")
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads (default: the runtime's own, e.g. one per core; eager torch 1, which does not collapse when "
                        "another process shares the cores)")
    p.add_argument("--no-spin", action="store_true",
                   help="runtimes whose idle threads busy-wait: let them sleep instead (slower on an idle machine, much faster "
                        "when other processes share the cores)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="edge-spec", description="Lossless speculative decoding on device.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__import__('edge_spec').__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="generate text (streams to stdout, stats to stderr)")
    _add_model(gen)
    gen.add_argument("--prompt", required=True, help="the prompt text; '-' reads it from stdin")
    gen.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    gen.add_argument("--quiet", action="store_true", help="print only the final text, no streaming")
    _add_sampling(gen)
    _add_spec(gen)
    exp = sub.add_parser("export", help="export a target (+ drafter) to a bundle: manifest.json + tokenizer + graphs")
    exp.add_argument("--model", default=DEFAULT_MODEL,
                     help="built-in name (smollm2-135m, gemma3-270m) or a Hugging Face checkpoint folder (default smollm2-135m)")
    exp.add_argument("--drafter", default=None,
                     help="'builtin', 'builtin:mtp' / 'builtin:eagle3', a drafter folder or 'none' (default: the built-in "
                          "drafter when the model ships one: its EAGLE-3 drafter for smollm2-135m and gemma3-270m (their MTP "
                          "one for --format qnn and coreml); otherwise none)")
    exp.add_argument("--format", default=formats.DEFAULT_FORMAT, choices=list(formats.FORMATS),
                     help=cli_options.format_help())
    exp.add_argument("--quant", default=None, choices=list(formats.precisions()), help=cli_options.quant_help())
    exp.add_argument("--max-context", type=int, default=None, help="KV cache size in tokens (default min(2048, model max))")
    exp.add_argument("--max-draft-len", type=int, default=8, help="largest --spec-k the bundle accepts (default 8)")
    exp.add_argument("--max-pass", type=int, default=None,
                     help="most tokens per forward (prefill chunk, verify pass): sliding-window targets (Gemma-4) get "
                          "rings of window + max-pass - 1 slots, formats with planned buffers plan them for it, "
                          "fixed-shape formats export it as the longest pass length (default 64, or max-draft-len + 1 "
                          "if larger)")
    exp.add_argument("--kv", default=None, choices=[BINDING_IO, BINDING_STATE, BINDING_SHARED], help=cli_options.kv_help())
    cli_options.add_format_options(exp, EXPORT)
    exp.add_argument("--no-datastore", dest="datastore", action="store_false",
                     help="ship no static datastore (default: datastore.bin built from the target's committed "
                          "regenerated answers, data/regenerated/<target>, where there are any, beside an MTP drafter; "
                          "none beside an EAGLE-3 drafter, which drafts better without it)")
    exp.add_argument("--datastore", dest="datastore", action="store_true",
                     help="ship the static datastore whatever the drafter (see --no-datastore)")
    exp.set_defaults(datastore=None)
    exp.add_argument("--out", required=True, help="bundle folder to write (replaced atomically if it is a bundle)")
    check = sub.add_parser("check", help="probe whether this host keeps a bundle batch-invariant (verify rows == "
                                         "decode steps bit for bit), which exact speculative decoding needs")
    _add_model(check)
    check.add_argument("--drafter", default=None, help="with --model: 'builtin' or a drafter folder")
    check.add_argument("--json", default=None, help="also write the result as JSON here")
    cli_options.add_format_options(check, CHECK)
    from edge_spec.peers import add_arguments as add_peer_arguments

    bench = sub.add_parser("bench", help="measure plain vs speculative decoding (+ peers): Markdown, JSON, plot")
    _add_model(bench, native=True)
    bench.add_argument("--native-bin", default=None,
                       help="with --runtime native: the edge-spec-run to measure (default $EDGE_SPEC_NATIVE, else "
                            "build/native/edge-spec-run, which `make native` builds)")
    bench.add_argument("--drafter", default=None, help="with --model: 'builtin' or a drafter folder")
    bench.add_argument("--prompts", default=None,
                       help="JSONL {\"prompt\": ..., \"chat\": true|false} (default: 9 shipped prompts, chat/docs/code)")
    bench.add_argument("--num-prompts", type=int, default=None, help="use only the first N prompts")
    bench.add_argument("--spec-k", type=int, nargs="+", default=[1, 2, 4, 8], help="k values (default 1 2 4 8)")
    bench.add_argument("--temperature", type=float, nargs="+", default=[0.0], help="temperatures (default 0)")
    bench.add_argument("--adaptive", action="store_true", help="also measure adaptive k (max = largest --spec-k)")
    bench.add_argument("--max-new-tokens", type=int, default=128)
    bench.add_argument("--repeats", type=int, default=1, help="passes over the prompts (default 1)")
    add_peer_arguments(bench)
    bench.add_argument("--no-lookup", dest="lookup", action="store_false",
                       help="speculative configurations draft with the MTP drafter only (default: retrieval first)")
    bench.add_argument("--no-datastore", dest="datastore", action="store_false",
                       help="speculative configurations draft without the static datastore (default: with it, where "
                            "the bundle or model has one)")
    bench.add_argument("--no-memory-probe", dest="memory_probe", action="store_false",
                       help="report the bench process's own peak memory instead of decoding every prompt once more in "
                            "a process of its own (default: that decode's peak, measured as each peer's; the Python "
                            "runtimes)")
    bench.add_argument("--require-exact", action="store_true",
                       help="exit 1 if greedy speculative output differed from plain on any prompt, or the host check "
                            "found this host's kernels not batch-invariant")
    bench.add_argument("--json", default=None, help="write a JSON list: one object per configuration and per peer")
    bench.add_argument("--markdown", default=None, help="write the Markdown table (with the command line) here")
    bench.add_argument("--plot", default=None, help="write a PNG: tok/s vs k and acceptance by position")
    head = sub.add_parser("bench-head", help="benchmark the clustered vs dense drafter head (Markdown table)")
    head.add_argument("--model", default="smollm2-135m")
    head.add_argument("--hidden-size", type=int, default=256, help="drafter hidden size (default 256)")
    head.add_argument("--layers", type=int, default=2, help="drafter layers (default 2)")
    head.add_argument("--heads", type=int, default=None, help="drafter query heads (default: as train-drafter's)")
    head.add_argument("--intermediate-size", type=int, default=1024, help="drafter MLP width (default 1024)")
    head.add_argument("--clusters", type=int, nargs="+", default=[512, 1024, 2048],
                      help="vocabulary cluster counts to measure (default 512 1024 2048)")
    head.add_argument("--top-k", type=int, default=32, help="clusters kept per step (default 32)")
    head.add_argument("--repeats", type=int, default=50)
    head.add_argument("--json", default=None, help="also write the rows as JSON to this file")
    from edge_spec.train.cli import add_parsers

    add_parsers(sub)
    from edge_spec.serve.command import add_parser as add_serve_parser

    add_serve_parser(sub)
    from edge_spec.serve.bench import add_parser as add_bench_serve_parser

    add_bench_serve_parser(sub)
    return parser


def cmd_check(args: argparse.Namespace) -> int:
    """Probe afresh (the cache entry is replaced); exit 0 when some row mode is exact on this host, 1 when none is.
    The bundle format's check options (formats.CHECK) add its runtime's `diagnose` report."""
    import json
    from pathlib import Path

    from edge_spec.api import load

    engine = load(args.model or DEFAULT_MODEL, drafter=args.drafter, runtime=args.runtime, max_context=args.max_context,
                  threads=args.threads, bundle=args.bundle, spin=not args.no_spin, host_check=False,
                  **cli_options.given_options(args, RUN))
    fmt = formats.format_of_runtime(engine.runtime)
    diagnostics = formats.check_options(fmt, cli_options.given_options(args, CHECK), CHECK, runtime=engine.runtime)
    what = args.bundle or args.model or DEFAULT_MODEL
    kind = (f"{engine.manifest.format} {engine.manifest.precision}" if engine.manifest and fmt is not None
            else f"{engine.runtime} fp32")
    print(f"edge-spec check: {what} ({kind}, runtime {engine.runtime})")
    result = engine.check_host(fresh=True)
    print(result.report())
    if diagnostics:
        module = formats.runtime_for(fmt.name)
        print(module.diagnose(Path(args.bundle), engine.manifest, threads=args.threads, **diagnostics))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"what": str(what), "format": kind, **result.to_json()}, f, indent=1)
    return 0 if result.exact else 1


def cmd_bench(args: argparse.Namespace) -> int:
    from edge_spec.benchmark.command import main as bench_main

    return bench_main(args)


def cmd_bench_head(args: argparse.Namespace) -> int:
    from edge_spec.benchmark.bench_head import main as bench_main

    return bench_main(args)


def cmd_export(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from edge_spec.api import (datastore_by_default, default_drafter, drafter_family, load_export_drafter,
                                resolve_drafter)
    from edge_spec.contract.manifest import NATIVE_EAGLE3_FORMATS
    from edge_spec.contract.atomic import check_out
    from edge_spec.contract.bundle import export_bundle
    from edge_spec.contract.formats import check_binding, check_options, check_precision, exporter, get_format
    from edge_spec.decoding.datastore_source import bundle_datastore
    from edge_spec.loading.checkpoints import load as load_checkpoint

    fmt = get_format(args.format)
    args.quant = args.quant or fmt.precisions[0]
    check_precision(fmt, args.quant)  # before any loading
    if args.kv is not None:
        check_binding(fmt, args.kv)
    options = check_options(fmt, cli_options.given_options(args, EXPORT), EXPORT)
    check_out(args.out)  # a bad --out fails now, not after the export's minutes (the write checks again)
    module = exporter(args.format)
    choice = default_drafter(args.model) if args.drafter is None else args.drafter
    choice = None if choice == "none" else choice
    eagle3 = False  # an EAGLE-3 drafter: its graphs are export steps of their own (a bad choice fails below)
    if choice:
        try:
            eagle3 = drafter_family(resolve_drafter(choice, args.model, fmt=args.format)) == "eagle3"
        except (EdgeSpecError, OSError):
            pass
    steps = module.export_steps(choice is not None, max_draft_len=args.max_draft_len, max_pass=args.max_pass,
                                eagle3=eagle3, **options)
    bar = tqdm(total=steps + 1, desc="export", unit="step", file=sys.stderr,
               bar_format="{desc}: {n}/{total} {bar} {elapsed} {postfix}")

    def progress(step: str) -> None:
        bar.set_postfix_str(step)
        bar.update(1)

    try:
        progress("loading the checkpoints")
        drafter_folder = resolve_drafter(choice, args.model, fmt=args.format) if choice else None
        if choice == "builtin" and drafter_folder != resolve_drafter(choice, args.model):
            tqdm.write(f"export: the native runner (the phone apps) runs no EAGLE-3 drafter in {args.format} bundles "
                       f"(it runs them in {', '.join(NATIVE_EAGLE3_FORMATS)} ones): shipping {args.model}'s built-in "
                       f"{drafter_family(drafter_folder)} drafter (--drafter builtin:eagle3 where the Python runtime "
                       "is enough)", file=sys.stderr)
        target = load_checkpoint(args.model)
        # an MTP drafter folder, or a Speculators EAGLE-3 one (every shipped format)
        drafter = load_export_drafter(drafter_folder, target) if drafter_folder else None
        ship = datastore_by_default(drafter) if args.datastore is None else args.datastore
        if args.datastore is None and not ship:
            tqdm.write("export: no static datastore beside an EAGLE-3 drafter (it drafts better with prompt lookup "
                       "alone); --datastore ships one", file=sys.stderr)
        out = export_bundle(target, args.out, format=args.format, drafter=drafter,
                            drafter_source=str(drafter_folder.resolve()) if drafter_folder else None,
                            precision=args.quant, max_context=args.max_context, max_draft_len=args.max_draft_len,
                            max_pass=args.max_pass, progress=progress, binding=args.kv,
                            datastore=bundle_datastore(args.model, target.config.vocab_size) if ship else None,
                            **options)
        bar.set_postfix_str("done")
    finally:
        bar.close()
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"wrote {out} ({size / 1e6:.1f} MB, {args.format} {args.quant}"
          f"{', with drafter' if drafter is not None else ''})", file=sys.stderr)
    return 0


def read_prompt(arg: str, stdin=None) -> str:
    """The prompt text from `--prompt` ('-': stdin's bytes), strictly UTF-8: invalid bytes are refused before any
    model loads (argv carries them as surrogate escapes, stdin as raw bytes)."""
    from edge_spec.errors import ConfigError

    if arg == "-":
        data = (stdin or sys.stdin.buffer).read()
        where = "stdin"
    else:
        data = arg.encode("utf-8", "surrogateescape")
        where = "--prompt"
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(f"the prompt on {where} is not valid UTF-8 (byte {err.start}: {data[err.start:err.start + 4]!r})",
                          "pass UTF-8 text, e.g. convert it with `iconv -t UTF-8`") from None


def cmd_generate(args: argparse.Namespace) -> int:
    from edge_spec.api import check_seed, load
    from edge_spec.errors import ConfigError
    from edge_spec.decoding.sampling import SamplingParams

    SamplingParams(args.temperature, args.top_k, args.top_p)  # fail on bad values before loading a model
    check_seed(args.seed)
    if args.bundle is not None and (args.model is not None or args.drafter is not None):
        raise ConfigError("--bundle cannot be combined with --model or --drafter (a bundle brings its own)",
                          "drop --model/--drafter, or drop --bundle to run a checkpoint")
    prompt = read_prompt(args.prompt)
    engine = load(args.model or DEFAULT_MODEL, drafter=args.drafter, runtime=args.runtime,
                  max_context=args.max_context, threads=args.threads, bundle=args.bundle, spin=not args.no_spin,
                  **cli_options.given_options(args, RUN))

    def stream(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    spec_k = engine.default_spec_k if args.spec_k is None else args.spec_k
    result = engine.generate(prompt, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                             top_k=args.top_k, top_p=args.top_p, seed=args.seed, chat=args.chat,
                             stream=None if args.quiet else stream, speculative=False if args.no_spec else None,
                             spec_k=spec_k, adaptive=args.adaptive, min_confidence=args.min_confidence,
                             lookup=args.lookup, datastore=args.datastore)
    if args.quiet:
        sys.stdout.write(result.text)
    sys.stdout.write("\n")
    print(f"[{engine.runtime}] {result.summary()}", file=sys.stderr)
    if "notice" in result.extra:
        print(f"notice: {result.extra['notice']}", file=sys.stderr)
    if "spec" in result.extra:
        print(f"[spec k={spec_k}{' adaptive' if args.adaptive else ''}] {result.extra['spec'].summary()}",
              file=sys.stderr)
        if engine.exactness is not None:
            print(f"[{engine.exactness.summary()}]", file=sys.stderr)
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from edge_spec.serve.command import main as serve_main

    return serve_main(args)


def cmd_bench_serve(args: argparse.Namespace) -> int:
    from edge_spec.serve.bench import main as bench_serve_main

    return bench_serve_main(args)


def _commands() -> dict:
    from edge_spec.train.cli import COMMANDS as drafter_commands

    return {"generate": cmd_generate, "export": cmd_export, "check": cmd_check, "bench": cmd_bench,
            "bench-head": cmd_bench_head, "serve": cmd_serve, "bench-serve": cmd_bench_serve,
            **drafter_commands}


def main(argv: list[str] | None = None) -> int:
    from edge_spec.logs import show_notices

    args = build_parser().parse_args(argv)
    show_notices()
    if args.command == "train-drafter":  # long batch work on a shared machine: idle OpenMP threads must
        import os                         # sleep, not spin (spinning collapses throughput under contention)

        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    try:
        return _commands()[args.command](args)
    except EdgeSpecError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `edge-spec generate ... | head -c1`: the reader left; stop quietly, as the native runner
        import os            # does (and point stdout at /dev/null so the interpreter's final flush cannot fail again)

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a writer killed by a closed pipe


if __name__ == "__main__":
    sys.exit(main())
