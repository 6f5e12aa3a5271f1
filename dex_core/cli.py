"""The ``dex`` command line. Flags derive from ``DexConfig``; bad input exits with code 2."""

from __future__ import annotations

import argparse
import sys
import time
import typing
from dataclasses import MISSING

from .config import DexConfig, DexError

_GENERATE_FLAGS = ("model", "depths", "explorers", "decs", "max_new_tokens", "temperature", "top_k",
                   "top_p", "seed", "chat", "dtype")


def _add_config_flags(parser: argparse.ArgumentParser, names) -> None:
    hints = typing.get_type_hints(DexConfig)
    for f in DexConfig.options():
        if f.name not in names:
            continue
        flag = "--" + f.name.replace("_", "-")
        help_ = f.metadata["help"]
        default = None if f.default is MISSING else f.default
        if hints[f.name] is bool:
            parser.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction,
                                default=default, help=help_)
            continue
        kind = {int: int, float: float}.get(hints[f.name], None)
        if kind is None:
            args = typing.get_args(hints[f.name])
            kind = int if int in args else float if float in args else str
        parser.add_argument(flag, dest=f.name, type=kind, default=default,
                            help=f"{help_} (default: {default})")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dex", description="Depth Exploration Decoding (DEX): "
                                     "lossless, depth-parallel decoding of Hugging Face causal LMs.")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="generate text with DEX and print depth statistics",
                         description="Stream DEX's output for PROMPT, then rounds/token, the "
                                     "depth-side speedup K/(rounds/token) and the matched-stage histogram.")
    gen.add_argument("prompt", help="the prompt text")
    _add_config_flags(gen, _GENERATE_FLAGS)
    gen.add_argument("--trace", metavar="FILE", help="save the trace (JSON) to FILE")
    return parser


def encode_prompt(tokenizer, prompt: str, chat: bool) -> list[int]:
    """Token ids of ``prompt``; through the tokenizer's chat template when it has one and ``chat``."""
    if not prompt.strip():
        raise DexError("the prompt is empty; give some text to continue")
    if chat and getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                            add_generation_prompt=True, tokenize=True)
        if hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return list(ids)
    return tokenizer(prompt, add_special_tokens=True)["input_ids"]


class TextStream:
    """Prints the decoded text of a growing token list, holding back incomplete characters."""

    def __init__(self, tokenizer, out=sys.stdout):
        self.tokenizer, self.out, self.tokens, self.shown = tokenizer, out, [], ""

    def push(self, token: int) -> None:
        self.tokens.append(token)
        text = self.tokenizer.decode(self.tokens, skip_special_tokens=True)
        if text.endswith("\ufffd"):
            return
        self.out.write(text[len(self.shown):] if text.startswith(self.shown) else "\n" + text)
        self.out.flush()
        self.shown = text


def _generate(args) -> None:
    from .engine import DexDecoder
    from .models import load_model
    from .trace import save_trace

    config = DexConfig(**{name: getattr(args, name) for name in _GENERATE_FLAGS})
    if not args.prompt.strip():
        raise DexError("the prompt is empty; give some text to continue")
    model, tokenizer = load_model(config.model, dtype=config.dtype)
    ids = encode_prompt(tokenizer, args.prompt, config.chat)
    decoder = DexDecoder(model, depths=config.depths, explorers=config.explorers, decs=config.decs,
                         tokenizer=tokenizer, trace_top=config.trace_top)
    stream = TextStream(tokenizer)
    events = []
    tic = time.perf_counter()
    for event in decoder.stream(ids, config.max_new_tokens, config.temperature, config.top_k,
                                config.top_p, config.seed):
        events.append(event)
        if event["event"] == "round" and event["commit"]:
            stream.push(event["commit"]["token"])
    elapsed = time.perf_counter() - tic
    stats = events[-1]["stats"]
    hist = [0] * decoder.K
    for k in stats["matched_stages"]:
        hist[k] += 1
    print("\n", file=sys.stdout)
    print(f"depths {list(decoder.depths)} (K={decoder.K}), decs={'on' if config.decs else 'off'}, "
          f"{stats['tokens']} tokens in {stats['rounds']} rounds, stop: {stats['stop']}")
    print(f"rounds/token {stats['rounds_per_token']:.3f}   depth-side speedup K/(rounds/token) "
          f"{stats['depth_speedup']:.3f}x")
    print("matched stage: " + "  ".join(f"{k}@{d}: {c}" for k, (d, c) in enumerate(zip(decoder.depths, hist))))
    print(f"sequential schedule: {stats['tokens'] / elapsed:.1f} tokens/s measured on one device; "
          f"projected K-device time {stats['projected_seconds']:.2f} s vs measured {elapsed:.2f} s")
    if args.trace:
        save_trace(args.trace, events, {"model": config.model, "prompt": args.prompt})
        print(f"trace saved to {args.trace}")


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "generate":
            _generate(args)
    except DexError as err:
        print(f"dex: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ndex: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
