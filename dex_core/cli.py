"""The ``dex`` command line: argument parsing above the library. Flags derive from the options dataclasses;
bad input prints one ``dex: error:`` line and exits with code 2."""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

from .algorithm.sampling import TIE_ULPS
from .analysis.ead import EadConfig, ead_summary, run_ead
from .analysis.plan import PlanConfig, run_plan
from .config import DTYPES, ConsoleOptions, DexConfig, DexError
from .data.ranking import token_ranking
from .decoder import DexDecoder
from .device import exact_float32_matmuls
from .distributed.group import ExplorerError
from .distributed.torchrun import USAGE
from .evaluation.bench.bench import BenchConfig, run_bench
from .evaluation.bench.report import terminal, write_outputs
from .evaluation.paper.paper import PROGRESS, PaperConfig, run_paper, write_paper
from .evaluation.verify import verifier_model, verify_trace
from .flags import add_flags, from_args
from .log import quiet_libraries
from .log import stderr as log
from .model.adapter_choice import load_adapters
from .model.load import load_model
from .model.proposal import store_ranking
from .runtime.console import TextStream, print_report
from .runtime.heap import settle
from .runtime.request import check_text, encode_prompt, no_chat_template
from .serving import serve, torchrun
from .trace.files import load_trace, save_trace
from .training.group import run_training
from .training.plan import run_train_plan
from .training.train import TrainConfig

GENERATE_FLAGS = tuple(f for f in DexConfig.__dataclass_fields__ if f not in ("trace_top", "eos_token_id"))


class _Parser(argparse.ArgumentParser):
    """Bad flags are DexErrors too: one ``dex: error:`` line and exit code 2, like every other bad input.
    No abbreviations (every subcommand's parser is one of these): ``--device`` must not pass as ``--devices``."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, allow_abbrev=False, **kwargs)

    def error(self, message):
        raise DexError(f"{self.prog}: {message} (see {self.prog} --help)")


def _generate_arguments(p) -> None:
    p.add_argument("prompt", help="the prompt text")
    add_flags(p, DexConfig, GENERATE_FLAGS)
    p.add_argument("--trace", metavar="FILE", help="save the trace (JSON) to FILE")


def _train_arguments(p) -> None:
    helps = {
        "backend": "sequential: the whole model in this process; distributed: --explorers processes on this "
        "machine, each loading one stage of the model and training the adapters inside it; torchrun: this "
        "program runs once per rank under torchrun (across nodes too; the ranks are the launch's)",
        "explorers": "distributed: rank processes, one stage each",
    }
    add_flags(p, DexConfig, ("model", "device", "devices", "backend", "explorers"), helps)
    p.add_argument("--out", required=True, help="adapter file to write (.safetensors)")
    p.add_argument(
        "--checkpoint",
        help="sequential: a checkpoint file; distributed and torchrun: a checkpoint folder (a file per rank and a "
        "manifest); resumed from when it exists, updated as it trains",
    )
    add_flags(p, TrainConfig)


def _shortlist_arguments(p) -> None:
    p.add_argument("file", help="adapter file (.safetensors) to update")
    add_flags(p, DexConfig, ("model", "device"))


def _ead_arguments(p) -> None:
    add_flags(p, EadConfig)
    p.add_argument("--out", help="write the JSON report here (default: print it)")


def _bench_arguments(p) -> None:
    add_flags(p, BenchConfig)
    p.add_argument("--out", help="JSON report (with a 'results' list)")
    p.add_argument(
        "--markdown", help="markdown tables with every column (the terminal shows the essential ones)"
    )


def _paper_arguments(p) -> None:
    add_flags(p, PaperConfig)
    p.add_argument(
        "--out",
        required=True,
        help=f"folder for paper.json and paper.html; while a run is unfinished it keeps {PROGRESS} there, and "
        "the same command started again resumes from it",
    )


def _plan_arguments(p) -> None:
    p.add_argument(
        "model", nargs="?", default=None, help="model spec, as for dex generate (or give --config)"
    )
    add_flags(p, PlanConfig, tuple(n for n in PlanConfig.__dataclass_fields__ if n != "model"))


def _verify_arguments(p) -> None:
    p.add_argument("trace", help="a trace file saved by DEX (dex generate --trace, the app's Debugger)")
    p.add_argument("--model", help="model to verify with (default: the model the trace's metadata names)")
    p.add_argument(
        "--dtype",
        choices=DTYPES,
        help="dtype to load it in (default: the trace's; float32 for traces that do not record one)",
    )
    p.add_argument(
        "--allow-download",
        action="store_true",
        help="fetch the model if it is not present locally (default: refuse; a trace can name any model)",
    )
    add_flags(p, DexConfig, ("device",))


SUBCOMMANDS = {  # name: (help, description, its arguments)
    "generate": (
        "generate text with DEX and print depth statistics",
        "Stream DEX's output for PROMPT (the model's own answer: what AR decoding gives), then the exploration "
        "set, the matched-stage histogram, rounds against AR through the same stages (the depth-side speedup "
        "K/(rounds/token)) and tokens/s on this machine.",
        _generate_arguments,
    ),
    "serve": (
        "serve DEX: an OpenAI-compatible HTTP API (--http), or prompts as one explorer rank under torchrun",
        f"With --http HOST:PORT: an OpenAI-compatible API (docs/SERVING.md) on the sequential or distributed "
        f"schedule, or under torchrun from rank 0. Under torchrun without it, one process per explorer "
        f"({USAGE}): rank 0 reads prompts (--prompt, repeatable; else one per line on stdin) and prints "
        "each answer and its stats.",
        torchrun.add_arguments,
    ),
    "train-adapters": (
        "train inducing adapters by self-distillation on ShareGPT",
        "Train inducing adapters for a model (frozen) by full-vocabulary KL self-distillation on "
        "ShareGPT's training split; save them as one safetensors file usable with "
        "DexDecoder(adapters=FILE).",
        _train_arguments,
    ),
    "shortlist": (
        "store the light proposal heads' token ranking in an adapter file",
        "Count the tokens of the training text (ShareGPT train split) with the model's tokenizer and store "
        "the ranking, most frequent first, in FILE; non-final stages then score its first N tokens "
        "(--proposal-vocab).",
        _shortlist_arguments,
    ),
    "ead": (
        "token readiness: EAD, predicted speedups, best exploration sets (JSON)",
        "Greedy AR answers to prompt sets, then per token the earliest available depth (plain and stable), the "
        "stage DEX matches at (DECS-aware), the predicted depth-side speedup of the uniform split for each K, "
        "the oracle S_EAD, and the best exploration set per K under rounds x longest stage.",
        _ead_arguments,
    ),
    "bench": (
        "DEX vs AR vs depth-selection baselines, exactness checked",
        "Run HF generate, AR on DEX's stage runner, DEX (sequential, optionally distributed; with and without "
        "draft chains), self-speculation (tuned on a separate split), HF assistant_early_exit and HF prompt "
        "lookup over prompt sets (humaneval, chat, grounded); report exactness, tokens/s and critical-path "
        "layer forwards per token as JSON and markdown (python -m visualize.report draws the JSON as a chart).",
        _bench_arguments,
    ),
    "paper": (
        "the paper's figures on your model: one JSON file and a standalone HTML report",
        "Run the paper's evaluation matrix on a model (dex bench over HumanEval, chat and grounded prompts, "
        "K = 2..8, DEX against self-speculation, AdaDecode- and DEL-style selection and the EAD oracle; DECS on "
        "and off, greedy and at temperature 1.0; stable-EAD histograms) and write paper.json and paper.html "
        "(plotly inlined, opens offline) to --out, each figure with the paper's claim and this run's result.",
        _paper_arguments,
    ),
    "plan": (
        "does a model fit its explorers' GPUs? memory per rank from the config alone",
        "Count, from the model's configuration alone (no weights), what each explorer process will hold: its "
        "layers, the LM head (or its light head's rows), rank 0 the embeddings, adapters, the KV cache for "
        "--context tokens plus the lattice's rows and the round's work buffers; per GPU with the CUDA context. "
        "Exit 1 when a GPU does not fit --gpu-memory.",
        _plan_arguments,
    ),
    "verify": (
        "certify a trace's tokens against the unmodified model (exit 1 if any fails)",
        "Run the unmodified model teacher-forced over the trace's prompt and committed tokens (one forward, "
        "logits in float32) and check that every token is the model's choice or within the tie gap of it (a "
        "numerical near-tie in the trace's dtype). Prints each token beyond the gap, then 'certified: N of M "
        "tokens within the tie gap (worst gap G)'; exit 0 when all are, else 1.",
        _verify_arguments,
    ),
}


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="dex",
        description="Depth Exploration Decoding (DEX): lossless, depth-parallel decoding "
        "of Hugging Face causal LMs.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (summary, description, arguments) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=summary, description=description)
        arguments(p)
        add_flags(p, ConsoleOptions)
    return parser


def _writable(path: str | None) -> None:
    """Fail before the work starts when an output file cannot be written."""
    if not path:
        return
    if not Path(path).resolve().parent.is_dir():
        raise DexError(f"cannot write {path}: its folder does not exist")
    existed = Path(path).exists()
    try:
        open(path, "a").close()
    except OSError as err:
        raise DexError(f"cannot write {path}: {err.strerror or err}") from None
    if not existed:
        Path(path).unlink()


def _generate(args) -> None:
    config = from_args(DexConfig, args)
    _writable(args.trace)
    prompt = check_text(args.prompt)  # checked once, before any model loads
    # distributed: this process reads config and tokenizer, each explorer its own part of the checkpoint
    decoder = DexDecoder.from_pretrained(
        config.model, config.decoder(), dtype=config.dtype, device=config.device, log=log
    )
    settle()  # the loaded model out of the collector's sight (runtime.heap)
    tokenizer = decoder.tokenizer
    ids = encode_prompt(tokenizer, prompt, config.chat)
    if no_chat_template(tokenizer, config.chat):
        log(no_chat_template(tokenizer, config.chat))
    stream, events = TextStream(tokenizer), []
    try:
        tic = time.perf_counter()
        for event in decoder.stream(ids, options=config.generation(), node_text=bool(args.trace)):
            events.append(event)
            for commit in event.commits:
                stream.push(commit.token)
        elapsed = time.perf_counter() - tic
        stream.finish()
    finally:
        decoder.close()
    print_report(events[-1].stats, events[0], elapsed, config.backend)
    if args.trace:
        save_trace(args.trace, events, {"model": config.model, "prompt": args.prompt})
        print(f"trace saved to {args.trace}")


def _serve(args) -> None:
    """``dex serve``: a torchrun rank, the OpenAI-compatible API (``--http``), or both (``dex_core.serving.serve``)."""
    serve.run(args)


def _train(args) -> None:
    cfg = from_args(TrainConfig, args)
    _writable(args.out)
    facts = run_training(args, cfg, log)
    if facts is None:  # a torchrun rank other than 0: rank 0 reports
        return
    print(
        f"adapters for depths {list(facts['depths'])} saved to {args.out}: {facts['tokens']} tokens, "
        f"{facts['steps']} steps, {facts['seconds']:.0f} s, final loss {facts['final_loss']:.4f}"
    )
    if facts.get("stopped_early"):
        print(
            f"stopped early at step {facts['steps']} of {facts['planned_steps']}: run the same command to resume "
            f"from {args.checkpoint}"
            if args.checkpoint
            else "stopped early (no checkpoint to resume from)"
        )


def _ead(args) -> None:
    cfg = from_args(EadConfig, args)
    _writable(args.out)
    report = run_ead(cfg, log)
    for line in ead_summary(report):
        print(line, file=sys.stderr)
    text = json.dumps(report, indent=1)
    if args.out:
        Path(args.out).write_text(text)
        print(f"report written to {args.out}", file=sys.stderr)
    else:
        print(text)


def _shortlist(args) -> None:
    config = from_args(DexConfig, args)
    model, tokenizer = load_model(config.model, device=config.device)
    load_adapters(args.file, model)  # a wrong or foreign file fails before the counting
    ranking = token_ranking(tokenizer, model.config.vocab_size)
    store_ranking(args.file, model, ranking)
    print(f"{args.file}: ranking of {len(ranking)} tokens stored (first 8: {ranking[:8].tolist()})")


def _bench(args) -> None:
    cfg = from_args(BenchConfig, args)
    _writable(args.out)
    _writable(args.markdown)
    report = run_bench(cfg, log=log)
    write_outputs(report, args.out, args.markdown)
    print(terminal(report, args.markdown, args.out))


def _paper(args) -> None:
    cfg = from_args(PaperConfig, args)
    write_paper(run_paper(cfg, log, args.out), args.out, log)
    Path(args.out, PROGRESS).unlink(missing_ok=True)  # the report is whole: nothing is left to resume


def _plan(args) -> int:
    cfg = from_args(PlanConfig, args)
    lines, fits = (run_train_plan if cfg.train else run_plan)(cfg, log)
    print("\n".join(lines))
    return 0 if fits else 1


def _verify(args) -> int:
    events, meta = load_trace(args.trace)  # typed
    model, tokenizer = verifier_model(
        events, meta, args.model, args.dtype, args.device, log, allow_download=args.allow_download
    )
    cert = verify_trace(events, meta, model=model, spec=args.model, dtype=args.dtype)
    start, word = events[0], lambda t: repr(tokenizer.decode([t]))
    for c in cert.uncertified:
        print(
            f"token {c.index} (position {c.position}): {c.token} {word(c.token)} is not the model's choice "
            f"{c.top} {word(c.top)}: gap {c.gap:.6g} > tie gap {c.tie_gap:.6g}"
        )
    s = start.sampling
    how = (
        "greedy" if not s["temperature"] else f"sampled (temperature {s['temperature']:g}, seed {s['seed']})"
    )
    print(
        f"{start.method} trace, {how}; {cert.dtype} on {cert.device}; tie gap {TIE_ULPS} units in the last place "
        f"of the logit's magnitude{' / temperature' if s['temperature'] else ''}"
    )
    print(cert.summary())
    return 0 if cert.ok else 1


COMMANDS = {
    "generate": _generate,
    "serve": _serve,
    "train-adapters": _train,
    "ead": _ead,
    "bench": _bench,
    "shortlist": _shortlist,
    "paper": _paper,
    "plan": _plan,
    "verify": _verify,
}


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Library warnings (e.g. generation-config settings DEX does not apply) as ``dex: warning:`` lines."""
    print(f"dex: warning: {message}", file=sys.stderr if file is None else file)


def main(argv=None) -> int:
    exact_float32_matmuls()  # once per process: float32 stays float32 (device.py)
    shown, warnings.showwarning = warnings.showwarning, _show_warning
    try:
        args = build_parser().parse_args(argv)
        with quiet_libraries(not from_args(ConsoleOptions, args).verbose):
            code = COMMANDS[args.command](args)
    except DexError as err:
        print(f"dex: error: {err}", file=sys.stderr)
        return 2
    except ExplorerError as err:
        print(f"dex: error: {str(err).splitlines()[0]}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\ndex: interrupted", file=sys.stderr)
        return 130
    finally:
        warnings.showwarning = shown
    return code or 0


if __name__ == "__main__":
    sys.exit(main())
