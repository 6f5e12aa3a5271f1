"""The cost model: layer-equivalents by parameter count, the two views, and its agreement with the
layers-only critical path and with a DEX run's own batch sizes."""

import random

import pytest
import torch

from dex_core import DexDecoder
from dex_core.evaluation.baselines.speculation import self_spec_layer_forwards
from dex_core.model.adapters import new_adapters
from dex_core.model.cost import VIEWS, ModelCost
from dex_core.testing import tiny_model, tiny_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    """One tokenizer for the module: the light heads' token ranking is derived from it once (about 2 s)."""
    return tiny_tokenizer()


def test_the_head_and_adapters_are_weighed_in_layer_equivalents_by_parameter_count():
    model = tiny_model("llama", layers=6, vocab=96)  # hidden 48, MLP 96, 4 heads / 2 KV heads of 12
    layer = 48 * 48 * 2 + 48 * 24 * 2 + 3 * 48 * 96 + 2 * 48  # q, o; k, v; MLP; two norms
    cost = ModelCost.of(model, new_adapters(model, [2], bottleneck=96))
    assert cost.num_layers == 6
    assert cost.head == pytest.approx((96 * 48 + 48) / layer)
    assert cost.adapter == pytest.approx((48 + 48 * 96 + 96 + 96 * 48 + 48 + 1) / layer)
    assert cost.ar() == pytest.approx(6 + cost.head)


def weights_read(model, root) -> int:
    """Parameters that one forward of ``model`` reads inside ``root``, counted by hooks on the modules that ran;
    an embedding is a lookup of a few rows, not a read of its matrix, so it is left out."""
    seen = {}
    hooks = [
        m.register_forward_hook(
            lambda mod, *_: seen.update({id(p): p.numel() for p in mod.parameters(recurse=False)})
        )
        for m in root.modules()
        if not isinstance(m, torch.nn.Embedding)
    ]
    try:
        with torch.no_grad():
            model(torch.tensor([[1, 2, 3]]))
    finally:
        for hook in hooks:
            hook.remove()
    return sum(seen.values())


@pytest.mark.parametrize("family,tied", [("llama", False), ("qwen3", True)])
def test_an_ar_token_costs_the_weights_that_one_forward_reads(family, tied):
    model = tiny_model(family, layers=6, vocab=96, tie_word_embeddings=tied)
    layer = weights_read(model, model.model.layers[0])
    cost = ModelCost.of(model)
    assert cost.ar() == pytest.approx(
        weights_read(model, model) / layer
    )  # a tied head is read once, as the head
    assert cost.head == pytest.approx(
        (weights_read(model, model.lm_head) + weights_read(model, model.model.norm)) / layer
    )


def test_one_stage_dex_is_ar_and_k_stages_partition_the_layers():
    cost = ModelCost(30, 8.0, 0.4, proposal=1.3)
    for view in VIEWS:  # DEX through one stage is AR: one row, every layer and the full head per token
        assert cost.dex((30,), [[1]] * 7, 7, view) == pytest.approx(cost.ar())
    plain = cost.layers_only()
    for depths in [(8, 15, 23, 30), (1, 30), (10, 20, 30), (29, 30), tuple(range(1, 31))]:
        busy = [1] * len(depths)
        assert plain.dex_round(depths, busy, "memory", devices="1") == 30  # one device: every layer once
        assert plain.dex_round(depths, busy, "memory") == max(b - a for a, b in zip((0,) + depths, depths))
        # on one device DEX adds to AR's work exactly the non-final stages' proposals (light heads, adapters)
        extra = cost.dex_round(depths, busy, "memory", depths[:-1], devices="1") - cost.ar()
        assert extra == pytest.approx((len(depths) - 1) * (1.3 + 0.4))
    uniform = (10, 20, 30)  # AR through a 3-stage pipeline: 3 rounds of 10 layers per token, AR's 30 layers
    assert plain.dex_steady(uniform, 3.0) == 30 and plain.dex(uniform, [[1, 1, 1]] * 10, 10, "memory") == 10


def test_the_steady_state_bound_reads_the_final_head_once_per_token():
    heavy = ModelCost(18, 30.0, 0.5, proposal=1.0)  # a Gemma-like head: heavier than all the layers
    depths = (9, 12, 14, 18)  # stages 9 + 1 + 0.5, 3 + 1 + 0.5, 2 + 1 + 0.5 and 4 + 30
    # the final explorer's 34 LE once per token, the first explorer's 10.5 in the other 1.5 rounds
    assert heavy.dex_steady(depths, 2.5, depths[:-1]) == pytest.approx(34 + 1.5 * 10.5)
    assert heavy.dex_steady((18,), 1.0) == heavy.ar()  # one stage: AR
    chained = heavy.dex_steady(depths, 0.5, depths[:-1])  # draft chains: under one round per token
    assert chained == pytest.approx(0.5 * 34)


def test_views_differ_only_when_batches_hold_several_rows():
    cost = ModelCost(30, 8.0, 0.5)
    depths, adapters = (8, 15, 23, 30), (8, 15, 23)
    rng = random.Random(0)
    for _ in range(50):
        batches = [rng.choice([0, 0, 1, 1, 2, 3]) for _ in depths]
        memory = cost.dex_round(depths, batches, "memory", adapters, devices="1")
        rows = cost.dex_round(depths, batches, "rows", adapters, devices="1")
        assert (rows == memory) == (max(batches) <= 1) and rows >= memory
    for k in range(len(depths)):
        one = cost.stage(depths, k, 1, "memory", adapters)
        assert [cost.stage(depths, k, n, "rows", adapters) for n in range(5)] == [0.0] + [
            n * one for n in range(1, 5)
        ]
        assert [cost.stage(depths, k, n, "memory", adapters) for n in range(5)] == [0.0] + [one] * 4
    assert cost.dex_round(depths, [3, 0, 0, 0], "memory", adapters) == cost.stage(
        depths, 0, 1, "memory", adapters
    )
    with pytest.raises(ValueError, match=r"view must be one of \('memory', 'rows'\); got 'flops'"):
        cost.stage(depths, 0, 1, "flops")


def test_light_heads_and_adapters_weigh_on_the_non_final_stages_only():
    depths = (8, 15, 23, 30)
    full, light = ModelCost(30, 8.0, 0.5), ModelCost(30, 8.0, 0.5, proposal=1.3)
    for k in range(4):
        saved = full.stage(depths, k, 1, "memory") - light.stage(depths, k, 1, "memory")
        added = full.stage(depths, k, 1, "memory", depths[:-1]) - full.stage(depths, k, 1, "memory")
        assert (saved, added) == ((0.0, 0.0) if k == 3 else (pytest.approx(8.0 - 1.3), pytest.approx(0.5)))


@pytest.mark.parametrize("view", VIEWS)
def test_self_speculation_without_drafts_is_ar_and_every_draft_costs_more(view):
    cost = ModelCost(30, 8.0, 0.4)
    for exit_layer in (1, 8, 29):
        steps = [cost.self_spec_step(exit_layer, n, view, with_adapter=True) for n in range(6)]
        assert steps[0] == pytest.approx(cost.ar()) and all(b > a for a, b in zip(steps, steps[1:]))
        # layers only, rows counted: the n drafts and the verified token are n + 1 rows through every layer once
        assert cost.layers_only().self_spec_step(exit_layer, 4, "rows") == 5 * 30
    omega = torch.tensor([True, True, False, True, False, False, True, True, True, True])
    steps, forwards = self_spec_layer_forwards(omega, 3, 8, 30)  # what dex bench replays from a run's matches
    assert forwards == steps * cost.layers_only().self_spec_step(8, 3, "memory")


@pytest.mark.parametrize(
    ("options", "sampling"),
    [
        ({"explorers": 3, "draft": "none", "prune": None}, {}),
        ({"explorers": 4, "draft": "none", "prune": 1}, {"temperature": 1.0, "seed": 3}),
        ({"explorers": 3, "draft": "auto", "prune": None}, {}),
    ],
)
def test_a_dex_runs_cost_from_its_batch_sizes_is_at_most_the_steady_state_bound(llama, options, sampling):
    prompt = [3, 1, 4, 1, 5, 3, 1, 4, 1, 5, 3, 1]  # repeats, so draft chains find n-grams
    result = DexDecoder(llama, **options).generate(prompt, 24, **sampling)
    depths, batches, tokens = result.stats.depths, result.stats.batch_sizes, len(result.tokens)
    final_rounds = sum(1 for b in batches if b[-1])
    # what the bound rests on: the final explorer holds rows in one round per token, fewer with draft chains
    assert final_rounds == tokens if options["draft"] == "none" else 0 < final_rounds < tokens
    assert len(batches) > tokens  # and the others work in more rounds than that
    cost = ModelCost(6, 9.0, 0.0, proposal=0.5)  # a head heavier than the layers, as on Gemma
    exact = cost.dex(depths, batches, tokens, "memory")
    assert 0 < exact <= cost.dex_steady(depths, result.stats.rounds_per_token) + 1e-9
    assert cost.dex(depths, batches, tokens, "rows") >= exact


def test_the_seconds_profile_times_layers_heads_and_a_real_two_process_exchange(llama, tmp_path, monkeypatch):
    from dex_core.analysis import profile as prof

    monkeypatch.setattr(prof, "CACHE", tmp_path)
    model = llama
    got = prof.measure_profile(model, proposal_rows=16, repeats=2, log=lambda *_: None)
    for part in ("layer", "head", "proposal", "exchange"):
        seconds = [got[part][n] for n in prof.ROWS]
        assert sorted(got[part]) == list(prof.ROWS) and len(set(seconds)) == len(prof.ROWS), (
            part,
            seconds,
        )  # one timing per n
        assert all(1e-6 < s < 1.0 for s in seconds), (
            part,
            seconds,
        )  # real work timed in seconds: not a bare stamp pair
    assert len(list(tmp_path.glob("*.json"))) == 1
    assert prof.measure_profile(model, proposal_rows=16, log=lambda *_: pytest.fail("not cached")) == got
    table = {1: 1.0, 2: 2.0, 4: 3.0}
    assert [prof.interpolate(table, n) for n in (0, 1, 3, 4, 6)] == [0.0, 1.0, 2.5, 3.0, 4.0]
    assert prof.exchange_seconds({"exchange": table}, [3, 0, 1]) == 2.5


def test_each_block_is_timed_in_decode_order_after_a_warm_up_and_its_median_kept():
    from dex_core.analysis.profile import decode_order_seconds

    class FakeClock:  # advances only when a block says how long it took
        now = 0.0

        def stamp(self):
            return self.now

        def since(self, start):
            return self.now - start

    clock, calls = FakeClock(), []
    took = {
        "layer": iter([100.0, 3.0, 1.0, 2.0]),
        "head": iter([200.0, 7.0, 9.0, 8.0]),
    }  # the first: the warm-up

    def block(name):
        def run():
            calls.append(name)
            clock.now += next(took[name])

        return run

    assert decode_order_seconds({"layer": block("layer"), "head": block("head")}, 3, clock) == {
        "layer": 2.0,
        "head": 8.0,
    }
    assert calls == ["layer", "head"] * 4  # interleaved as a decode runs them, never one block in a loop


def test_the_trace_records_the_weights_and_a_viewer_rebuilds_the_same_cost_model(llama, tokenizer):
    decoder = DexDecoder(
        llama, explorers=3, proposal_vocab=8, adapters=new_adapters(llama, [2, 4]), tokenizer=tokenizer
    )
    start = decoder.generate([1, 2, 3], 4).trace[0]
    built = ModelCost.of(llama, decoder.adapters, decoder.proposal_vocab)
    assert start.cost == built.weights() and start.cost["proposal"] < start.cost["head"]
    assert ModelCost.from_weights(start.num_layers, start.cost) == built
    assert ModelCost.from_weights(6, None) == built.layers_only()


def test_a_runs_cost_read_from_its_trace_is_the_decoders_own_count_and_a_trace_without_weights_counts_layers(
    llama, tokenizer
):
    from dex_core.analysis.run_cost import RunCost, run_cost, trace_cost
    from dex_core.trace.events import parse_event

    decoder = DexDecoder(
        llama, explorers=3, proposal_vocab=8, adapters=new_adapters(llama, [2, 4]), tokenizer=tokenizer
    )
    result = decoder.generate([1, 2, 3], 12)
    stats, adapted = result.stats, sorted(decoder.adapters)
    own = RunCost(
        memory=decoder.cost_model.dex(decoder.depths, stats.batch_sizes, stats.tokens, "memory", adapted),
        rows=decoder.cost_model.dex(decoder.depths, stats.batch_sizes, stats.tokens, "rows", adapted),
        ar=decoder.cost_model.ar(),
        whole=True,
    )
    assert run_cost(result.trace[0], stats.batch_sizes, stats.tokens) == own == trace_cost(result.trace)
    assert own.rows > own.memory > 0  # several rows a round on some stage: counted once memory-bound
    older_start = parse_event({k: v for k, v in result.trace[0].record().items() if k != "cost"})
    older = [older_start, *result.trace[1:]]  # a start event recorded before the weights were
    layers = decoder.cost_model.layers_only()
    assert trace_cost(older) == RunCost(
        memory=layers.dex(decoder.depths, stats.batch_sizes, stats.tokens, "memory", adapted),
        rows=layers.dex(decoder.depths, stats.batch_sizes, stats.tokens, "rows", adapted),
        ar=6.0,
        whole=False,
    )


def test_the_row_budget_prices_rows_by_the_rounds_they_save_or_else_keeps_every_step_near_two_rows():
    from dex_core.analysis.profile import row_budget, stage_seconds

    # this CPU's shape (benchmarks/row_budget.py): 2 and 3 rows dear, 4 to 8 cheaper still, 10 and up dearer
    cpu = {1: 0.6, 2: 1.0, 3: 1.08, 4: 0.83, 6: 0.75, 8: 0.8, 9: 0.95, 10: 1.22, 16: 1.0}
    assert row_budget(cpu) == 9  # 16 is within again, but a budget of 16 lets a stage run 10 rows
    assert row_budget(cpu, slack=0.05) == 2  # 3 rows cost 8% more
    flat = {1: 1.0, 8: 1.01, 32: 1.05, 64: 1.07}  # a GPU's: the 2-row step read off the line from 1 to 8
    assert row_budget(flat) == 64
    assert row_budget({1: 1.0, 2: 1.0, 4: 1.5}) == 2
    # priced: rounds a token x a round's seconds, least wins; 8 rows save 30% of the rounds for 10% more a round
    curve = {1: 0.5, 2: 1.0, 4: 1.25, 8: 1.1, 16: 1.6}
    assert row_budget(curve, {2: 1.0, 4: 0.9, 8: 0.7, 16: 0.6}) == 8  # 0.77 against 1.0, 1.125 and 0.96
    assert (
        row_budget(curve, {2: 1.0, 4: 0.98, 8: 0.95, 16: 0.9}) == 2
    )  # rows that buy little are not worth them
    assert row_budget(curve, {2: 1.0, 4: 0.8, 8: 0.95}) == 2  # 1.0 twice: a tie goes to the fewer rows
    profile = {"layer": {1: 1.0, 2: 2.0}, "proposal": {1: 0.5, 2: 0.5}}
    assert stage_seconds(profile, 3) == {1: 3.5, 2: 6.5}


def test_the_stage_curve_times_every_row_count_and_leaves_each_stage_at_its_prefix(llama):
    from dex_core.analysis import profile as prof

    made = []
    original = prof.Explorer

    def explorer(*args, **kwargs):
        made.append(original(*args, **kwargs))
        return made[-1]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(prof, "Explorer", explorer)
        stage, whole = prof.stage_curve(llama, 3, rows=(1, 2, 5), repeats=2, context=8)
    assert sorted(stage) == sorted(whole) == [1, 2, 5] and all(1e-6 < s < 1.0 for s in stage.values())
    assert all(whole[n] > stage[n] for n in stage)  # the round holds every stage
    L = llama.config.num_hidden_layers
    assert [e.layer_ids for e in made] == [
        list(range(round(L * k / 3), round(L * (k + 1) / 3))) for k in range(3)
    ]
    assert all(len(e.cache) == 8 and e.cache.committed == 8 for e in made)  # the rows timed were dropped
