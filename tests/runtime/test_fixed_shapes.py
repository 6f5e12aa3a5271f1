"""Rounds a GPU can capture: after warm-up a round runs no (op, shape) pair it has not run before (rows in buckets,
a fixed cache capacity, mask tables of fixed size), and a compiled stage step compiles once per bucket and emits
the tokens of the eager one (issue 44)."""

import pytest
import torch

from dex_core import DexDecoder, hf_greedy
from dex_core.shapes import OpShapes
from dex_core.testing import tiny_model
from dex_core.trace.events import RoundEvent

PROMPT = 20  # the prompts of one test share a length: the prefill is not a round, and runs the same shapes


def prompt(seed: int) -> list[int]:
    return torch.randint(0, 96, (PROMPT,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama", layers=8)


def rows_per_stage(result) -> set[int]:
    return {len(b) for e in result.trace if isinstance(e, RoundEvent) for b in e.batches if b}


def recorded(decoder, tokens: list[int], new: int):
    """The run's result and every (op, shapes) pair its rounds ran."""
    shapes = OpShapes()
    with shapes:
        result = decoder.generate(tokens, new)
    return result, shapes.seen


def test_after_warm_up_rounds_run_no_new_op_shapes_beyond_the_buckets(model):
    decoder = DexDecoder(model, explorers=4, prune=3)  # at most 3 rows: 1, 2, and 3 padded to the bucket of 4
    warm, before = recorded(decoder, prompt(1), 48)
    result, after = recorded(decoder, prompt(2), 160)
    rounds = sum(isinstance(e, RoundEvent) for e in result.trace)
    assert rounds >= 100 and rows_per_stage(result) == {
        1,
        2,
        3,
    }  # long, every size of batch, one of them padded
    assert result.tokens == hf_greedy(model, prompt(2), 160)
    assert after - before == set(), sorted(after - before)[:5]
    _, wider = recorded(DexDecoder(model, explorers=4, prune=8), prompt(2), 24)
    assert any(
        s and s[0] == 8 for _, shapes in wider - before for s in shapes
    )  # the counter sees a new bucket


def test_a_compiled_stage_step_compiles_once_per_bucket_and_equals_eager(model):
    compiled = {}  # explorer index -> the input shapes of each compilation

    def counting(index):
        def backend(graph, inputs):
            compiled.setdefault(index, []).append(tuple(tuple(x.shape) for x in inputs[:2]))
            return graph.forward

        return backend

    decoder = DexDecoder(model, explorers=3, prune=2)
    for e in decoder.explorers:
        e.compile_step(backend=counting(e.index))
    first = decoder.generate(prompt(3), 40)
    assert first.tokens == hf_greedy(model, prompt(3), 40)
    buckets = rows_per_stage(first)
    assert buckets == {1, 2}
    assert all(len(shapes) == len(set(shapes)) <= len(buckets) for shapes in compiled.values()), compiled
    assert sorted(compiled) == [0, 1, 2]
    seen = {k: list(v) for k, v in compiled.items()}
    second = decoder.generate(prompt(4), 40)  # warm: no compilation at all
    assert compiled == seen and second.tokens == hf_greedy(model, prompt(4), 40)
