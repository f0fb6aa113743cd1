"""`edge-spec` command line. Errors the user can fix print one line (`error: ...`) and exit 2."""

from __future__ import annotations

import argparse
import sys

from .errors import EdgeSpecError

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
    p.add_argument("--spec-k", type=int, default=4, help="draft tokens per target pass (the maximum with --adaptive)")
    p.add_argument("--adaptive", action="store_true",
                   help="choose k per pass from costs measured at run time; stop drafting at low confidence")
    p.add_argument("--min-confidence", type=float, default=0.3,
                   help="adaptive mode: end a burst when the drafter's probability of its draft is below this")
    p.add_argument("--no-spec", action="store_true", help="plain decoding even when a drafter is loaded")


def _add_model(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="smollm2-135m",
                   help="built-in name (smollm2-135m) or a Hugging Face checkpoint folder (default smollm2-135m)")
    p.add_argument("--runtime", default="torch", choices=["torch"], help="execution runtime (default torch)")
    p.add_argument("--max-context", type=int, default=None, help="KV cache size in tokens (default min(2048, model max))")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: the runtime's choice)")


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
    head = sub.add_parser("bench-head", help="benchmark the clustered vs dense drafter head (Markdown table)")
    head.add_argument("--model", default="smollm2-135m")
    head.add_argument("--hidden-size", type=int, default=256, help="drafter hidden size (default 256)")
    head.add_argument("--layers", type=int, default=2, help="drafter layers (default 2)")
    head.add_argument("--top-k", type=int, default=32, help="clusters kept per step (default 32)")
    head.add_argument("--repeats", type=int, default=50)
    head.add_argument("--json", default=None, help="also write the rows as JSON to this file")
    return parser


def cmd_bench_head(args: argparse.Namespace) -> int:
    from .bench_head import main as bench_main

    return bench_main(args)


def cmd_generate(args: argparse.Namespace) -> int:
    from .api import load
    from .sampling import SamplingParams

    SamplingParams(args.temperature, args.top_k, args.top_p)  # fail on bad values before loading a model
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    engine = load(args.model, drafter=args.drafter, runtime=args.runtime, max_context=args.max_context,
                  threads=args.threads)

    def stream(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    result = engine.generate(prompt, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                             top_k=args.top_k, top_p=args.top_p, seed=args.seed, chat=args.chat,
                             stream=None if args.quiet else stream, speculative=not args.no_spec if args.drafter else None,
                             spec_k=args.spec_k, adaptive=args.adaptive, min_confidence=args.min_confidence)
    if args.quiet:
        sys.stdout.write(result.text)
    sys.stdout.write("\n")
    print(f"[{args.runtime}] {result.summary()}", file=sys.stderr)
    if "spec" in result.extra:
        print(f"[spec k={args.spec_k}{' adaptive' if args.adaptive else ''}] {result.extra['spec'].summary()}",
              file=sys.stderr)
    return 0


COMMANDS = {"generate": cmd_generate, "bench-head": cmd_bench_head}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except EdgeSpecError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
