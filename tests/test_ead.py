"""EAD analysis: definitions on scripted matches, and agreement with real DEX runs."""

import torch

from conftest import tiny_model
from dex_core import DexDecoder
from dex_core.ead import analyse, layer_matches


def test_ead_and_stable_ead_follow_their_definitions():
    omega = torch.tensor([[0, 0, 0, 1, 1, 1],   # ready at 4
                          [1, 0, 1, 1, 0, 1],   # first match 1, stable only at 6
                          [1, 1, 1, 1, 1, 1]], dtype=torch.bool)
    out = analyse(omega, explorers=[2, 3, 6])
    assert out["ead"] == [4, 1, 1] and out["ead_stable"] == [4, 6, 1]
    assert out["oracle"] == 6 * 3 / (4 + 6 + 1)
    by_k = {p["explorers"]: p for p in out["predicted"]}
    assert by_k[2]["depths"] == [3, 6] and by_k[2]["speedup"] == 18 / (6 + 6 + 3)
    assert by_k[6]["speedup"] == out["oracle"]
    assert by_k[3]["rounds_speedup"] == 3 * 3 / (2 + 2 + 1)  # stages [2, 4, 6]: first matches 1, 1, 0


def test_dex_without_decs_matches_at_the_shallowest_layer_match():
    model = tiny_model("llama", layers=6, seed=5)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    for depths in [(2, 4, 6), (1, 2, 3, 4, 5, 6), (3, 6)]:
        result = DexDecoder(model, depths=depths, decs=False).generate(prompt, 40)
        omega = layer_matches(model, prompt, result.tokens)
        first = omega[:, [d - 1 for d in depths]].float().argmax(dim=1).tolist()
        assert result.stats.matched_stages == first
