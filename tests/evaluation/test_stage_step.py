"""The real-size section's stage step (``dex_core.evaluation.bench.stage_step``): what it times is an explorer's
expansion without its host work, the same work every call, eager and compiled alike."""

import torch

from dex_core.evaluation.bench import stage_step
from dex_core.evaluation.bench.real_size import SHAPES, one_layer_model, scaled
from dex_core.evaluation.bench.stage_step import host_seconds, host_table, stages, step_blocks, step_modes
from dex_core.model.explorer import Explorer


def test_the_stage_step_is_an_expansion_without_its_host_work_and_repeats_the_same_work(monkeypatch):
    context, n = 24, 4
    model = one_layer_model(scaled(SHAPES["Llama-2-70B"]), "cpu", dtype=torch.float32)
    torch.manual_seed(0)
    explorers = stages(model, context, n, step_modes("cpu"))  # the CPU's modes: eager, and aot_eager's graph
    assert list(explorers) == ["eager", "compiled"]
    assert step_modes("cuda") == {"compiled": {"mode": "default"}, "captured": {"mode": "reduce-overhead"}}
    hidden = torch.randn(n, model.config.hidden_size)  # (n, hidden)
    blocks = step_blocks(
        explorers, hidden, context
    )  # tables made and sent once; the compiled step compiled, warm

    def boom(*args, **kwargs):
        raise AssertionError("host work inside the timed step")

    monkeypatch.setattr(Explorer, "table", boom)
    monkeypatch.setattr(stage_step, "to_device", boom)
    with torch.inference_mode():
        first = {mode: fn().clone() for mode, fn in blocks.items()}
        again = {mode: fn().clone() for mode, fn in blocks.items()}
    monkeypatch.undo()
    torch.manual_seed(0)
    reference = stages(model, context, n, {})["eager"]  # the same prefix, expanded as a round does
    with torch.inference_mode():
        expanded = reference.expand(hidden, list(range(n)), [context] * n, [(i,) for i in range(n)])
    for mode in blocks:
        torch.testing.assert_close(first[mode], expanded)  # an expansion's output, without its host work
        assert torch.equal(first[mode], again[mode])  # the same entries written every call
        assert len(explorers[mode].cache) == explorers[mode].cache.committed == context  # nothing extended
    assert len(reference.cache) == context + n
    assert host_seconds(explorers["eager"], n, context, repeats=3) > 0
    assert host_table(explorers["eager"], n, context) == explorers["eager"].table(
        n, [0, 1, 2, 3], [context] * n, [(0,), (1,), (2,), (3,)]
    )


def test_where_a_captured_step_ran_the_layer_and_the_tp_shards_are_read_in_that_mode():
    from dex_core.evaluation.bench.real_size import Plan, time_shape

    plan = Plan(context=16, repeats=1, rows=(1, 2, 8), ranks=(2,), step_rows=(1, 8))
    # on a CPU no CUDA graph: "captured" here is aot_eager's graph, enough to follow the mode through the tables
    t = time_shape(scaled(SHAPES["Llama-2-70B"]), "cpu", plan, {"captured": {"backend": "aot_eager"}})
    assert t["layer_mode"] == "captured" and t["layer"] is t["step"]["captured"]
    assert sorted(t["step"]["eager"]) == [1, 2, 8] and sorted(t["layer"]) == [
        1,
        8,
    ]  # compiled at the step rows
    assert (
        list(t["tp"][2]["step"]) == ["eager", "captured"]
        and t["tp"][2]["layer"] == t["tp"][2]["step"]["captured"]
    )
    assert t["bytes"]["tp"][2]["layer"] < t["bytes"]["layer"] and t["cudagraph_skips"] == 0
    assert min(t["host"].values()) > 0
