"""The compiled stage step in the shape a GPU captures (issue 59, ``dex_core.model.compiled``): its only mutated
input is the cache's buffer, marked static (else inductor skips the CUDA graph); its rows leave the graph's memory
before the link hands them on; the cache's capacity is fixed at a run's start; compilations stay within the
process's budget, past which a step runs eagerly; and every compiled run emits the eager run's tokens."""

import pytest
import torch

from dex_core import DexDecoder, hf_greedy
from dex_core.config import DexError
from dex_core.model import compiled
from dex_core.model.compiled import CompiledStep, compile_options
from dex_core.runtime.links import LocalLink
from dex_core.testing import tiny_model

CHECK = "dex_core.model.compiled:static_check"


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama", layers=8)


def prompt(seed: int, length: int = 20) -> list[int]:
    return torch.randint(0, 96, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("K, budget", [(2, 4), (8, 2)])
def test_the_compiled_step_mutates_no_input_that_is_not_static(model, K, budget):
    compiled.checked.clear()
    words = prompt(1, 12) * 3  # repeats: draft chains find matches and add rows
    decoder = DexDecoder(model, explorers=K, prune=budget, compile=CHECK)
    assert decoder.generate(words, 16).tokens == hf_greedy(model, words, 16)
    assert len(compiled.checked) >= K  # every explorer compiled; static_check raises on a loose input
    # the cache's two buffers: its entries and their tags
    assert all(mutated == 2 and loose == 0 for mutated, loose in compiled.checked)


def test_explorer_processes_compile_the_same_static_step(model, explorer_group):
    words = prompt(2)  # a compilation with a loose input would end the run with static_check's DexError
    decoder = explorer_group(model, 8, prune=1, compile=CHECK)  # one bucket a rank: one compilation each
    assert decoder.generate(words, 6).tokens == hf_greedy(model, words, 6)


def test_the_rows_a_link_hands_on_never_share_the_compiled_steps_memory(model, monkeypatch):
    outputs, held = [], []  # the graphs' outputs (kept alive: no address reused), the rows the link held

    def recording(graph, inputs):
        def run(*args):
            out = graph.forward(*args)
            outputs.extend(t for t in (out if isinstance(out, (list, tuple)) else [out]))
            return out

        return run

    hold = LocalLink.hold
    monkeypatch.setattr(
        LocalLink, "hold", lambda self, ids, hidden: (held.append(hidden), hold(self, ids, hidden))[1]
    )
    decoder = DexDecoder(model, explorers=2, prune=2)
    for e in decoder.explorers:
        e.compile_step(backend=recording)
    assert decoder.generate(prompt(3), 12).tokens == hf_greedy(model, prompt(3), 12)
    made = {t.untyped_storage().data_ptr() for t in outputs}
    assert held and outputs and not made & {h.untyped_storage().data_ptr() for h in held}


def test_compile_over_a_hundred_rounds_keeps_one_cache_and_the_eager_tokens():
    before, model = CompiledStep.count, tiny_model("llama", layers=8).to(torch.float32)  # float32
    words = prompt(4, 16)
    eager = DexDecoder(model, explorers=2, prune=4, draft="none").generate(words, 100)
    decoder = DexDecoder(model, explorers=2, prune=4, draft="none", compile="aot_eager")
    result = decoder.generate(words, 100)
    assert result.stats.rounds >= 100 and result.tokens == eager.tokens
    made = CompiledStep.count - before
    buckets = {(e, *b) for e in decoder.explorers for b in e.step.buckets}
    assert 2 <= made == len(buckets) <= 2 * 3 * 2  # rows 1, 2, 4; a region that may grow once
    assert all(e.cache.grown == 0 for e in decoder.explorers)  # the capacity set at the start held


def test_past_the_budget_a_new_bucket_runs_eagerly_with_one_line(model, monkeypatch, capfd):
    monkeypatch.setattr(compiled, "COMPILE_BUDGET", CompiledStep.count + 2)
    monkeypatch.setattr(CompiledStep, "warned", False)
    capfd.readouterr()
    decoder = DexDecoder(model, explorers=3, prune=2, compile="aot_eager")  # 3 explorers: 3 buckets at least
    for seed in (5, 6):
        assert decoder.generate(prompt(seed), 16).tokens == hf_greedy(model, prompt(seed), 16)
    assert sum(len(e.step.buckets) for e in decoder.explorers) == 2
    assert capfd.readouterr().err.count("runs without compiling from now on") == 1


def test_the_option_maps_to_torch_compiles_arguments():
    assert compile_options(True, "cuda:1") == {"mode": "reduce-overhead"}  # CUDA graphs on a GPU
    assert compile_options(True, "cpu") == {}
    assert compile_options("aot_eager", "cuda") == {"backend": "aot_eager"}
    assert compile_options(CHECK, "cpu") == {"backend": compiled.static_check}
    with pytest.raises(DexError, match="cannot be imported"):
        compile_options("dex_core.model.compiled:nothing", "cpu")
    with pytest.raises(DexError, match="compile must be"):
        compile_options(" ", "cpu")
