"""The ``dex`` command line. Flags derive from ``DexConfig``; bad input exits with code 2."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
import typing
from dataclasses import MISSING

from .config import DexConfig, DexError

_RUN_FLAGS = ("model", "depths", "explorers", "adapters", "decs", "max_new_tokens", "temperature", "top_k",
              "top_p", "seed", "chat", "dtype", "threads", "op_timeout", "start_timeout")
_GENERATE_FLAGS = _RUN_FLAGS + ("backend", "devices")


def _add_config_flags(parser: argparse.ArgumentParser, names, cls=DexConfig) -> None:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name not in names:
            continue
        flag = "--" + f.name.replace("_", "-")
        help_ = f.metadata["help"]
        default = None if f.default is MISSING else f.default
        if hints[f.name] is bool:
            parser.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction,
                                default=default, help=help_)
            continue
        args = typing.get_args(hints[f.name])
        if typing.get_origin(hints[f.name]) is tuple or any(typing.get_origin(a) is tuple for a in args):
            kind = str  # lists such as depths are given comma-separated and parsed by the dataclass
        else:
            kind = {int: int, float: float}.get(hints[f.name]) or (int if int in args else float if float in args else str)
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
    serve = sub.add_parser("serve", help="run as one explorer rank under torchrun (multi-node capable)",
                           description="Run under torchrun, one process per explorer: "
                                       "torchrun --nproc-per-node K -m dex_core.serve --prompt TEXT. Rank 0 "
                                       "reads prompts (--prompt, repeatable; else one per line on stdin) "
                                       "and prints each answer and its stats.")
    serve.add_argument("--prompt", action="append", help="a prompt (repeatable); default: lines of stdin")
    _add_config_flags(serve, _RUN_FLAGS)
    from .train import TrainConfig

    train = sub.add_parser("train-adapters", help="train inducing adapters by self-distillation on ShareGPT",
                           description="Train inducing adapters for a model (frozen) by full-vocabulary KL "
                                       "self-distillation on ShareGPT's training split; save them as one "
                                       "safetensors file usable with DexDecoder(adapters=FILE).")
    train.add_argument("--model", default=DexConfig.model, help="model spec (default: default)")
    train.add_argument("--out", required=True, help="adapter file to write (.safetensors)")
    train.add_argument("--checkpoint", help="checkpoint file: resumed from when it exists, updated as it trains")
    _add_config_flags(train, [f.name for f in dataclasses.fields(TrainConfig)], TrainConfig)
    ead = sub.add_parser("ead", help="token readiness: EAD, predicted speedups, best exploration sets (JSON)",
                         description="Greedy AR answers to prompt sets, then per token the earliest available "
                                     "depth (plain and stable), the stage DEX matches at (DECS-aware), the "
                                     "predicted depth-side speedup of the uniform split for each K, the oracle "
                                     "S_EAD, and the best exploration set per K under rounds x longest stage.")
    ead.add_argument("--model", default=DexConfig.model, help="model spec (default: default)")
    ead.add_argument("--adapters", default="default",
                     help="adapter file, 'default' or 'none'; comma-separate several to compare them on the same "
                          "answers (default: default)")
    ead.add_argument("--sets", default="humaneval,chat", help="prompt sets: humaneval, chat, builtin")
    ead.add_argument("--prompts", type=int, default=20, help="prompts per set, eval split (default: 20)")
    ead.add_argument("--max-new-tokens", type=int, default=128, help="new tokens per prompt (default: 128)")
    ead.add_argument("--explorers", default="2,3,4,5,6,7,8", help="values of K (default: 2..8)")
    ead.add_argument("--decs", action=argparse.BooleanOptionalAction, default=True,
                     help="predict with depth-coupled sampling (default: on)")
    ead.add_argument("--best", action=argparse.BooleanOptionalAction, default=True,
                     help="search the best exploration set per K (default: on)")
    ead.add_argument("--out", help="write the JSON report here (default: print it)")
    from .bench import BenchConfig

    bench = sub.add_parser("bench", help="DEX vs AR vs depth-selection baselines, exactness checked",
                           description="Run HF generate, AR on DEX's stage runner, DEX (sequential, optionally "
                                       "distributed), self-speculation (tuned on a separate split) and HF "
                                       "assistant_early_exit over prompt sets; report exactness, tokens/s and "
                                       "critical-path layer forwards per token as JSON, markdown and a chart.")
    _add_config_flags(bench, [f.name for f in dataclasses.fields(BenchConfig)], BenchConfig)
    bench.add_argument("--out", help="JSON report (with a 'results' list)")
    bench.add_argument("--markdown", help="markdown tables (default: printed)")
    bench.add_argument("--html", help="plotly chart (HTML)")
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

    def __init__(self, tokenizer, out=None):
        self.tokenizer, self.out, self.tokens, self.shown = tokenizer, out or sys.stdout, [], ""

    def push(self, token: int) -> None:
        self.tokens.append(token)
        text = self.tokenizer.decode(self.tokens, skip_special_tokens=True)
        if text.endswith("\ufffd"):
            return
        self.out.write(text[len(self.shown):] if text.startswith(self.shown) else "\n" + text)
        self.out.flush()
        self.shown = text


def _report(stats: dict, depths, decs: bool, elapsed: float, schedule: str) -> None:
    hist = [0] * len(depths)
    for k in stats["matched_stages"]:
        hist[k] += 1
    print("\n")
    print(f"depths {list(depths)} (K={len(depths)}), decs={'on' if decs else 'off'}, "
          f"{stats['tokens']} tokens in {stats['rounds']} rounds, stop: {stats['stop']}")
    print(f"rounds/token {stats['rounds_per_token']:.3f}   depth-side speedup K/(rounds/token) "
          f"{stats['depth_speedup']:.3f}x")
    print("matched stage: " + "  ".join(f"{k}@{d}: {c}" for k, (d, c) in enumerate(zip(depths, hist))))
    if schedule == "sequential":
        print(f"sequential schedule: {stats['tokens'] / elapsed:.1f} tokens/s measured on one device; "
              f"projected K-device time {stats['projected_seconds']:.2f} s vs measured {elapsed:.2f} s")
    else:
        print(f"distributed schedule: {stats['tokens'] / elapsed:.1f} tokens/s measured end to end "
              f"({elapsed:.2f} s; communication {stats['communication_seconds']:.2f} s on rank 0)")


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
                         adapters=config.adapters, tokenizer=tokenizer, trace_top=config.trace_top,
                         backend=config.backend, devices=config.devices, threads=config.threads,
                         op_timeout=config.op_timeout, start_timeout=config.start_timeout)
    stream = TextStream(tokenizer)
    events = []
    try:
        tic = time.perf_counter()
        for event in decoder.stream(ids, config.max_new_tokens, config.temperature, config.top_k,
                                    config.top_p, config.seed):
            events.append(event)
            if event["event"] == "round" and event["commit"]:
                stream.push(event["commit"]["token"])
        elapsed = time.perf_counter() - tic
    finally:
        decoder.close()
    _report(events[-1]["stats"], decoder.depths, config.decs, elapsed, config.backend)
    if args.trace:
        save_trace(args.trace, events, {"model": config.model, "prompt": args.prompt})
        print(f"trace saved to {args.trace}")


def _serve(args) -> None:
    import os

    import torch
    import torch.distributed as dist

    from .config import resolve_depths
    from .models import load_model
    from .serve import join_group, serve_request, stage_payload

    if "WORLD_SIZE" not in os.environ:
        raise DexError("dex serve runs one explorer per process under torchrun, e.g. "
                       "torchrun --nproc-per-node 4 -m dex_core.serve --prompt 'Hello'")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    config = DexConfig(**{name: getattr(args, name) for name in _RUN_FLAGS})
    model, tokenizer = load_model(config.model, dtype=config.dtype)
    depths = resolve_depths(model.config.num_hidden_layers, config.depths, world)
    if len(depths) != world:
        raise DexError(f"{len(depths)} exploration depths {list(depths)} need {len(depths)} processes; "
                       f"torchrun started {world}")
    eos = model.generation_config.eos_token_id
    eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    adapters = {}
    if config.adapters:
        from .adapters import load_adapters

        adapters = load_adapters(config.adapters, model)
    payload = stage_payload(model, depths, rank, adapters.get(depths[rank]) if rank < world - 1 else None)
    del model
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    device = f"cuda:{local}" if local < gpus else "cpu"
    torch.set_num_threads(config.threads or max(1, (os.cpu_count() or 1) // world))
    view, explorer, link = join_group(payload, device, "env://", world, 0, config.op_timeout,
                                      config.start_timeout)
    prompts = iter(args.prompt or (line.rstrip("\n") for line in sys.stdin))
    while True:
        request = None
        if rank == 0:
            text = next(prompts, None)
            while text is not None and not text.strip():
                text = next(prompts, None)
            if text is not None:
                request = {"prompt": encode_prompt(tokenizer, text, config.chat), "eos": eos,
                           "max_new_tokens": config.max_new_tokens, "temperature": config.temperature,
                           "top_k": config.top_k, "top_p": config.top_p, "seed": config.seed}
        box = [request]
        dist.broadcast_object_list(box, src=0, group=link.ctrl)
        if box[0] is None:
            break
        stream, tic = TextStream(tokenizer), time.perf_counter()
        for event in serve_request(view, depths, explorer, link, box[0], config.decs, 0):
            if rank == 0 and event["event"] == "round" and event["commit"]:
                stream.push(event["commit"]["token"])
        if rank == 0:
            _report(event["stats"], depths, config.decs, time.perf_counter() - tic, "distributed")
    dist.destroy_process_group()


def _train(args) -> None:
    from .models import load_model
    from .train import TrainConfig, train_adapters

    cfg = TrainConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig)})
    model, tokenizer = load_model(args.model)
    facts = train_adapters(model, tokenizer, cfg, args.out, args.checkpoint)
    print(f"adapters for depths {list(cfg.depths)} saved to {args.out}: {facts['tokens']} tokens, "
          f"{facts['steps']} steps, {facts['seconds']:.0f} s, final loss {facts['final_loss']:.4f}")


def _ead(args) -> None:
    import json

    import torch

    from .adapters import load_adapters
    from .bench import _ints, encode_item, greedy_answer
    from .data import prompt_set
    from .ead import analyse, layer_candidates
    from .models import load_model

    ks = _ints(args.explorers, "explorers")
    sets = [s for s in args.sets.replace(" ", "").split(",") if s]
    prompts = {name: prompt_set(name, args.prompts) for name in sets}
    if args.max_new_tokens < 1:
        raise DexError("max_new_tokens must be positive")
    model, tokenizer = load_model(args.model)
    if max(ks) > model.config.num_hidden_layers:
        raise DexError(f"K = {max(ks)} exceeds the model's {model.config.num_hidden_layers} layers")
    names = [a for a in args.adapters.split(",") if a]
    chosen = {name: {} if name == "none" else load_adapters(name, model) for name in names}
    answers = {}  # greedy AR answers, generated once and analysed under every adapter set
    for name, items in prompts.items():
        answers[name] = []
        for i, item in enumerate(items):
            ids = encode_item(tokenizer, item)
            out = greedy_answer(model, ids, args.max_new_tokens)
            answers[name].append((ids, out))
            print(f"[dex] {name} {i + 1}/{len(items)}: {len(out)} tokens", file=sys.stderr, flush=True)
    report = {"model": args.model, "max_new_tokens": args.max_new_tokens, "decs": args.decs, "runs": []}
    for adapter_name, adapters in chosen.items():
        run = {"adapters": adapter_name, "adapter_depths": sorted(adapters), "sets": {}}
        pooled = ([], [], [])
        for name, pairs in answers.items():
            cands = [layer_candidates(model, ids, out, adapters) for ids, out in pairs]
            toks = [t for _, out in pairs for t in out]
            lengths = [len(out) for _, out in pairs]
            run["sets"][name] = analyse(torch.cat(cands), toks, ks, args.decs, args.best, lengths)
            for acc, part in zip(pooled, (cands, toks, lengths)):
                acc.extend(part)
        run["all"] = analyse(torch.cat(pooled[0]), pooled[1], ks, args.decs, args.best, pooled[2])
        report["runs"].append(run)
        for name, result in {**run["sets"], "all": run["all"]}.items():
            print(f"adapters {adapter_name} / {name}: {result['tokens']} tokens, oracle S_EAD "
                  f"{result['oracle']:.3f}x", file=sys.stderr)
            for p in result["predicted"]:
                line = (f"  K={p['explorers']} uniform {p['depths']}: K/rounds {p['uniform']['depth_speedup']:.3f}x "
                        f"(no DECS {p['rounds_speedup_no_decs']:.3f}x), S_X {p['speedup']:.3f}x")
                if "best" in p:
                    line += (f"; best {p['best']['depths']}: pipeline {p['best']['pipeline_speedup']:.3f}x vs "
                             f"uniform {p['uniform']['pipeline_speedup']:.3f}x ({p['best_gain']:.3f}x)")
                print(line, file=sys.stderr)
    text = json.dumps(report, indent=1)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text)
        print(f"report written to {args.out}", file=sys.stderr)
    else:
        print(text)


def _bench(args) -> None:
    from .bench import BenchConfig, markdown, run_bench, write_outputs

    cfg = BenchConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(BenchConfig)})
    report = run_bench(cfg, log=lambda msg: print(f"[dex] {msg}", file=sys.stderr, flush=True))
    write_outputs(report, args.out, args.markdown, args.html)
    print(markdown(report))


def serve_main(argv=None) -> int:
    return main(["serve", *(sys.argv[1:] if argv is None else argv)])


def main(argv=None) -> int:
    from .serve import ExplorerError

    args = build_parser().parse_args(argv)
    try:
        if args.command == "generate":
            _generate(args)
        elif args.command == "serve":
            _serve(args)
        elif args.command == "train-adapters":
            _train(args)
        elif args.command == "ead":
            _ead(args)
        elif args.command == "bench":
            _bench(args)
    except DexError as err:
        print(f"dex: error: {err}", file=sys.stderr)
        return 2
    except ExplorerError as err:
        print(f"dex: error: {str(err).splitlines()[0]}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\ndex: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
