"""The cost model: layer-equivalents by parameter count, the two views, and its agreement with the
layers-only critical path and with a DEX run's own batch sizes."""

import pytest

from conftest import tiny_model, tiny_tokenizer
from dex_core import DexDecoder
from dex_core.adapters import new_adapters
from dex_core.cost import ModelCost


def test_the_head_and_adapters_are_weighed_in_layer_equivalents_by_parameter_count():
    model = tiny_model("llama", layers=6, vocab=96)  # hidden 48, MLP 96, 4 heads / 2 KV heads of 12
    layer = 48 * 48 * 2 + 48 * 24 * 2 + 3 * 48 * 96 + 2 * 48  # q, o; k, v; MLP; two norms
    cost = ModelCost.of(model, new_adapters(model, [2], bottleneck=96))
    assert cost.num_layers == 6
    assert cost.head == pytest.approx((96 * 48 + 48) / layer)
    assert cost.adapter == pytest.approx((48 + 48 * 96 + 96 + 96 * 48 + 48 + 1) / layer)
    assert cost.ar() == pytest.approx(6 + cost.head)


def test_layers_only_memory_bound_dex_is_rounds_times_the_longest_stage_and_self_spec_is_nE_plus_L():
    cost = ModelCost(30, 8.0, 0.4).layers_only()
    busy = [[1, 1, 1, 1]] * 10
    assert cost.dex((8, 15, 23, 30), busy, 4, "memory") == pytest.approx(10 * 8 / 4)
    assert cost.self_spec_step(8, 3, "memory") == 3 * 8 + 30


def test_views_differ_only_when_batches_hold_several_rows():
    cost = ModelCost(30, 8.0, 0.5)
    depths, adapters = (8, 15, 23, 30), (8, 15, 23)
    assert cost.stage(depths, 0, 3, "memory", adapters) == 8 + 8 + 0.5
    assert cost.stage(depths, 0, 3, "rows", adapters) == 3 * (8 + 8 + 0.5)
    assert cost.stage(depths, 3, 1, "memory", adapters) == 7 + 8  # the final stage takes no adapter
    assert cost.stage(depths, 2, 0, "memory", adapters) == 0
    assert cost.dex_round(depths, [2, 1, 0, 1], "memory", adapters) == 16.5  # K devices: the slowest explorer
    assert cost.dex_round(depths, [2, 1, 0, 1], "memory", adapters, devices="1") == 16.5 + 15.5 + 15
    assert cost.self_spec_step(8, 1, "rows") == 2 * 8 + 8 + 2 * (22 + 8)
    with pytest.raises(ValueError, match="view must be one of"):
        cost.stage(depths, 0, 1, "flops")


def test_a_dex_runs_cost_from_its_batch_sizes_is_at_most_the_steady_state_bound(llama):
    result = DexDecoder(llama, explorers=3).generate([3, 1, 4, 1, 5], 24)
    cost = ModelCost.of(llama)
    exact = cost.dex((2, 4, 6), result.stats.batch_sizes, 24, "memory")
    assert 0 < exact <= cost.dex_steady((2, 4, 6), result.stats.rounds_per_token) + 1e-9
    assert cost.dex((2, 4, 6), result.stats.batch_sizes, 24, "rows") >= exact


def test_the_seconds_profile_times_layers_heads_and_a_real_two_process_exchange(tmp_path, monkeypatch):
    from dex_core import profile as prof

    monkeypatch.setattr(prof, "CACHE", tmp_path)
    model = tiny_model("llama")
    got = prof.measure_profile(model, proposal_rows=16, repeats=2, log=lambda *_: None)
    for part in ("layer", "head", "proposal", "exchange"):
        assert sorted(got[part]) == list(prof.ROWS) and all(s > 0 for s in got[part].values())
    assert len(list(tmp_path.glob("*.json"))) == 1
    assert prof.measure_profile(model, proposal_rows=16, log=lambda *_: pytest.fail("not cached")) == got
    table = {1: 1.0, 2: 2.0, 4: 3.0}
    assert [prof.interpolate(table, n) for n in (0, 1, 3, 4, 6)] == [0.0, 1.0, 2.5, 3.0, 4.0]
    assert prof.exchange_seconds({"exchange": table}, [3, 0, 1]) == 2.5


def test_the_trace_records_the_weights_and_a_viewer_rebuilds_the_same_cost_model(llama):
    decoder = DexDecoder(llama, explorers=3, proposal_vocab=8, adapters=new_adapters(llama, [2, 4]), tokenizer=tiny_tokenizer())
    start = decoder.generate([1, 2, 3], 4).trace[0]
    built = ModelCost.of(llama, decoder.adapters, decoder.proposal_vocab)
    assert start["cost"] == built.weights() and start["cost"]["proposal"] < start["cost"]["head"]
    assert ModelCost.from_weights(start["num_layers"], start["cost"]) == built
    assert ModelCost.from_weights(6, None) == built.layers_only()
