"""An 8,000-round trace against the debugger: is it refused by the round cap, and what does replaying it
cost when the cap is raised?

    python benchmarks/trace_replay.py --rounds 8000 --frames 200

Builds the trace from a real one: a tiny random Llama (float64, 6 layers) decodes greedily with K = 4
and token text, and its rounds are repeated with fresh node ids, slots, round numbers and positions
until there are ``--rounds`` of them (in a child process, so that this one never holds the trace before
it loads it). Then, in this order:

1. ``load_trace`` with the default ``TraceLimits``: refused or not, the message, and how long it took;
2. ``load_trace`` with ``max_rounds`` raised to the trace's rounds, ``replay``, and frames: the process's
   resident memory (psutil RSS) before loading and after each step;
3. the time of one debugger frame (``lattice_figure`` + ``round_table_html`` + ``fsm_html`` +
   ``tokens_html`` + ``stats_html``) for ``--frames`` rounds spread over the trace, the last included:
   median and p95.

Acceptance (issue 14): refused by the cap, or < 200 MB extra RSS and < 100 ms per frame.
``--out`` writes the numbers as JSON.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import psutil

import visualize as viz
from dex_core import DexDecoder, DexError, load_trace, save_trace
from dex_core.testing import tiny_model, tiny_tokenizer
from dex_core.trace.events import EndEvent, Event, RoundEvent
from dex_core.trace.schema import TraceLimits
from dex_core.trace.stats import GenerationStats

RSS_GOAL_MB = 200
FRAME_GOAL_SECONDS = 0.1


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def _shift(ids, by: int) -> list[int]:
    return [i + by for i in ids]


def long_trace(rounds: int, tokens_per_copy: int = 24) -> list[Event]:
    """A valid DEX trace of ``rounds`` rounds: a real trace's rounds repeated with fresh ids."""
    base = (
        DexDecoder(tiny_model("llama"), explorers=4, tokenizer=tiny_tokenizer(), draft="none")
        .generate([1, 2, 3, 4], tokens_per_copy)
        .trace
    )  # one commit per round: the copies shift one commit record
    start, body = base[0], [e for e in base if isinstance(e, RoundEvent)]
    ids = 1 + max(n.id for e in body for n in e.nodes)
    slots = 1 + max(n.slot for e in body for n in e.nodes)
    events, tokens, copy = [start], [], 0
    while len(events) - 1 < rounds:
        node_off, tok_off = copy * ids, copy * tokens_per_copy
        for e in body[: rounds - (len(events) - 1)]:
            nodes = [
                replace(
                    n,
                    id=n.id + node_off,
                    slot=n.slot + copy * slots,
                    position=n.position + tok_off,
                    parent=None if n.parent is None else n.parent + node_off,
                )
                for n in e.nodes
            ]
            commits = [
                replace(
                    c,
                    index=c.index + tok_off,
                    position=c.position + tok_off,
                    anchor_nodes=_shift(c.anchor_nodes, node_off),
                )
                for c in e.commits
            ]
            collapse = e.collapse and {
                "committed": _shift(e.collapse["committed"], node_off),
                "kept": _shift(e.collapse["kept"], node_off),
                "dropped": _shift(e.collapse["dropped"], node_off),
                "new_anchor": None
                if e.collapse["new_anchor"] is None
                else e.collapse["new_anchor"] + node_off,
            }  # null without a commit
            tokens += [c.token for c in commits]
            events.append(
                replace(
                    e,
                    round=e.round + copy * len(body),
                    batches=[_shift(b, node_off) for b in e.batches],
                    alive=_shift(e.alive, node_off),
                    nodes=nodes,
                    commits=commits,
                    collapse=collapse,
                )
            )
        copy += 1
    events[0] = replace(start, max_new_tokens=len(tokens))
    stats = GenerationStats(
        explorers=4, depths=list(start.depths), tokens=len(tokens), rounds=rounds, stop="length"
    )
    events.append(EndEvent(tokens=tokens, stop="length", stats=stats))
    return events


def rss_mb() -> float:
    return psutil.Process().memory_info().rss / 2**20


def frame(view, end) -> None:
    viz.lattice_figure(view)
    viz.round_table_html(view), viz.fsm_html(view), viz.tokens_html(view), viz.stats_html(view, end)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=8000)
    parser.add_argument("--frames", type=int, default=200, help="frames timed, spread over the trace")
    parser.add_argument("--out", help="write the results as JSON here")
    parser.add_argument("--build", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.build:  # the child: write the traces, so the measuring process never holds them
        events = long_trace(args.rounds)
        save_trace(args.build, events, {"model": "tiny-llama"})
        save_trace(Path(args.build).with_suffix(".warm.json"), events[:40], {})
        return 0
    path = Path(tempfile.mkdtemp(prefix="dex-bench-")) / "long-trace.json"
    subprocess.run([sys.executable, __file__, "--rounds", str(args.rounds), "--build", str(path)], check=True)
    out: dict = {"rounds": args.rounds, "file_mb": path.stat().st_size / 2**20}
    tic = time.perf_counter()
    try:
        load_trace(path)
        out["refused_by_default_limits"] = False
    except DexError as err:
        out.update(refused_by_default_limits=True, message=str(err))
    out["default_load_seconds"] = time.perf_counter() - tic

    warm, _ = load_trace(path.with_suffix(".warm.json"))
    frame(viz.replay(warm)[-1], None)  # warm-up: imports plotly, compiles the schema validators
    del warm
    gc.collect()
    base = rss_mb()
    tic = time.perf_counter()
    events, _ = load_trace(path, TraceLimits(max_rounds=args.rounds))
    out["raised_load_seconds"] = time.perf_counter() - tic
    out["rss_after_load_mb"] = rss_mb() - base
    tic = time.perf_counter()
    views = viz.replay(events)
    out["replay_index_seconds"] = time.perf_counter() - tic
    out["rss_after_replay_mb"] = rss_mb() - base
    picks = sorted({round(i * (len(views) - 1) / max(1, args.frames - 1)) for i in range(args.frames)})
    seconds = []
    for i in picks:
        tic = time.perf_counter()
        frame(views[i], events[-1])
        seconds.append(time.perf_counter() - tic)
    out["rss_after_frames_mb"] = rss_mb() - base
    out.update(
        frames=len(picks),
        frame_median_ms=1000 * statistics.median(seconds),
        frame_p95_ms=1000 * percentile(seconds, 0.95),
        last_frame_ms=1000 * seconds[-1],
    )
    ok_replay = out["rss_after_frames_mb"] < RSS_GOAL_MB and out["frame_p95_ms"] < 1000 * FRAME_GOAL_SECONDS
    out["acceptance"] = "pass" if out["refused_by_default_limits"] or ok_replay else "fail"
    out["replay_within_goals"] = ok_replay

    print(f"{args.rounds} rounds, {out['file_mb']:.1f} MB on disk")
    print(
        f"default limits: {'refused' if out['refused_by_default_limits'] else 'accepted'} in "
        f"{out['default_load_seconds'] * 1000:.0f} ms" + (f" ({out['message']})" if "message" in out else "")
    )
    print(
        f"cap raised: load {out['raised_load_seconds']:.2f} s, "
        f"replay index {out['replay_index_seconds'] * 1000:.0f} ms; "
        f"extra RSS after load {out['rss_after_load_mb']:.0f} MB, after replay {out['rss_after_replay_mb']:.0f} MB, "
        f"after {len(picks)} frames {out['rss_after_frames_mb']:.0f} MB (goal < {RSS_GOAL_MB} MB)"
    )
    print(
        f"frame (lattice + panels): median {out['frame_median_ms']:.1f} ms, p95 {out['frame_p95_ms']:.1f} ms, "
        f"last round {out['last_frame_ms']:.1f} ms (goal < {FRAME_GOAL_SECONDS * 1000:.0f} ms)"
    )
    print(f"acceptance: {out['acceptance']}")
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=2))
    return 0 if out["acceptance"] == "pass" else 1


if __name__ == "__main__":
    sys.exit(main())
