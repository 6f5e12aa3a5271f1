"""Golden traces: DEX's full trace (timings stripped) over a matrix of settings on tiny float64 models, recorded
once and reproduced byte for byte by every later version (``tests/runtime/test_golden.py``; floats that differ only by
the CPU's kernels are taken as recorded: ``snapped``). They guard refactors of the round loop, the lattice and
the schedules: any change in what DEX computes or records shows up here.

    python tests/golden.py --write        # record tests/golden/traces.json.gz (only when a change is meant)

Matrix: K = 2, 3, 4 x DECS on/off x draft chains on/off x row budget none/1 x greedy and seeded sampling, on a
prompt that repeats (so draft chains commit several tokens per round); light proposal heads (8 rows) and the
top-3 candidates recorded throughout. The distributed schedule is checked against the same records.
"""

from __future__ import annotations

import functools
import gzip
import itertools
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dex_core import DexDecoder  # noqa: E402
from dex_core.testing import tiny_model, tiny_tokenizer  # noqa: E402

PATH = Path(__file__).resolve().parent / "golden" / "traces.json.gz"
PROMPT = [4, 8, 15, 16, 23, 42, 7] * 3
NEW_TOKENS = 12
TIMING = (
    "compute_seconds",
    "bookkeeping_seconds",
    "communication_seconds",
    "round_seconds",
    "projected_seconds",
    "prefill_seconds",
    "wall_seconds",
    "tokens_per_second",
    "reader_seconds",
    "model_seconds",
    "end_to_end_tokens_per_second",
)


def model():
    return tiny_model("qwen3", tie_word_embeddings=True, head_dim=16)


@functools.cache
def tokenizer():
    """One tokenizer for every case: the light heads' token ranking is derived from it once (and cached by it)."""
    return tiny_tokenizer()


def matrix() -> dict[str, dict]:
    """Every case: its name -> (decoder options, generation options)."""
    cases = {}
    for K, decs, draft, prune, sampled in itertools.product(
        (2, 3, 4), (True, False), ("gate=0", "none"), ("none", 1), (False, True)
    ):
        name = f"K{K}-decs{int(decs)}-draft{int(draft != 'none')}-prune{prune}-{'sampled' if sampled else 'greedy'}"
        sampling = {"temperature": 0.9, "top_k": 40, "top_p": 0.95, "seed": 3} if sampled else {}
        cases[name] = {
            "decoder": {
                "explorers": K,
                "decs": decs,
                "draft": draft,
                "prune": prune,
                "proposal_vocab": 8,
                "trace_top": 3,
            },
            "generation": sampling,
        }
    return cases


def stripped(trace: list) -> list[dict]:
    """A trace's records (``trace``: typed events) without what the clock decides (rounds' timings, the stats'
    seconds) and the start's model identity (recorded since these traces were; tests/evaluation/test_verify.py checks
    it)."""
    out = []
    for event in trace:
        event = event.record() if hasattr(event, "record") else event  # typed, or a record already
        event = {k: v for k, v in event.items() if k not in ("timings", "model")}
        if "stats" in event:
            event["stats"] = {k: v for k, v in event["stats"].items() if k not in TIMING}
        out.append(event)
    return out


def canonical(trace: list[dict]) -> str:
    return json.dumps(stripped(trace), sort_keys=True, separators=(",", ":"))


def decoder(case: dict, decoder_model=None, **schedule) -> DexDecoder:
    """A decoder for ``case`` (``schedule``: extra decoder options, e.g. the distributed backend)."""
    return DexDecoder(decoder_model or model(), tokenizer=tokenizer(), **case["decoder"], **schedule)


def trace(dex: DexDecoder, case: dict, against_record: bool = True) -> str:
    """``case``'s canonical trace from decoder ``dex``; its floats within the CPU's noise of the recorded trace's
    are written as recorded (``snapped``), so that it equals the record byte for byte wherever DEX computed the same."""
    live = stripped(dex.generate(PROMPT, NEW_TOKENS, node_text=True, **case["generation"]).trace)
    if against_record:
        names = [name for name, other in matrix().items() if other == case]
        if names:
            live = snapped(live, json.loads(recorded()[names[0]]))
    return canonical(live)


def run(case: dict, decoder_model=None, against_record: bool = True) -> str:
    """One case's canonical trace on the sequential schedule."""
    return trace(decoder(case, decoder_model), case, against_record)


@functools.cache
def recorded() -> dict[str, str]:
    return json.loads(gzip.decompress(PATH.read_bytes()))


def snapped(live, record, key: str = ""):
    """``live`` with each float replaced by the record's where the two differ only by the CPU's kernels: float64
    scores (a commit's margin) in their last bits (rel. ``1e-12``; AVX2 on the AMD machine that recorded the file,
    AVX-512 on an Intel one, differ by 1-2 units in the last place), and a candidate probability, which the trace
    rounds to 4 decimals from float32, by one unit of the 4th decimal (a value on a rounding boundary). Anything else
    that differs (a token, a node, a kind, a stage, a larger change of any number) stays as computed."""
    if isinstance(live, dict) and isinstance(record, dict):
        return {k: snapped(v, record.get(k), k) for k, v in live.items()}
    if isinstance(live, list) and isinstance(record, list) and len(live) == len(record):
        return [snapped(v, r, key) for v, r in zip(live, record)]
    if isinstance(live, float) and isinstance(record, float) and live != record:
        bound = 1.0001e-4 if key == "top" else 1e-12 * max(1.0, abs(record))
        return record if abs(live - record) <= bound else live
    return live


def write() -> None:
    """Record every case; a case this version reproduces keeps its recorded trace byte for byte."""
    shared = model()
    old = recorded() if PATH.is_file() else {}
    traces = {}
    for name, case in matrix().items():
        same = name in old and run(case, shared) == old[name]
        traces[name] = old[name] if same else run(case, shared, against_record=False)
    PATH.parent.mkdir(exist_ok=True)
    PATH.write_bytes(gzip.compress(json.dumps(traces, sort_keys=True).encode(), mtime=0))
    changed = sorted(name for name in traces if traces[name] != old.get(name))
    print(f"{len(traces)} traces written to {PATH} ({PATH.stat().st_size} bytes); changed: {changed}")


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        raise SystemExit(__doc__)
    write()
