"""DEX emits exactly the tokens of autoregressive decoding on Llama, Mistral (a sliding window), Qwen 2 and
Qwen 3 (float64 tiny models; the other families are tests/model/test_families.py): HF ``generate`` as the
greedy reference, every uniform K from 1 to L, one-token and long prompts, non-uniform exploration sets,
seeded sampling configs, EOS, AR through the stages. The golden traces (tests/runtime/test_golden.py) guard
Qwen 3's full traces at K = 2, 3, 4 under every option; these tests take each case once, not every combination
of them (options rotated across families)."""

import pytest
import torch

from dex_core import DexDecoder, ar_generate, hf_greedy
from dex_core.testing import tiny_model
from dex_core.trace.events import RoundEvent

FAMILIES = {
    "llama": {},
    "mistral": {"sliding_window": 12},  # a window shorter than the run exercises windowed masks
    "qwen2": {"tie_word_embeddings": True},
    "qwen3": {"tie_word_embeddings": True, "head_dim": 16},
}
# new tokens: several collapses, and past Mistral's window (the stage caches start at 256 entries: 64 tokens never
# grew them either)
NEW = 32


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family_model(request):
    return tiny_model(request.param, **FAMILIES[request.param])


def on(family: str, *values):
    """One case on ``family``'s model (the ``family_model`` fixture, parametrized indirectly)."""
    return pytest.param(family, *values, id="-".join(map(case_id, (family, *values))))


def case_id(value) -> str:
    if isinstance(value, dict):
        return "sampled" if value else "greedy"
    return ",".join(map(str, value)) if isinstance(value, tuple) else str(value)


# every prompt length on some family, Mistral's window met from one token and from a prompt past it
@pytest.mark.parametrize(
    "family_model,prompt_len",
    [on("llama", 23), on("mistral", 1), on("mistral", 23), on("qwen2", 5), on("qwen3", 1)],
    indirect=["family_model"],
)
def test_greedy_dex_equals_hf_generate_for_every_uniform_K(family_model, prompt_len):
    prompt = torch.randint(0, 96, (prompt_len,), generator=torch.Generator().manual_seed(prompt_len)).tolist()
    reference = hf_greedy(family_model, prompt, NEW)
    L = family_model.config.num_hidden_layers
    for K in (1, 2, 3, 4, L):
        result = DexDecoder(family_model, explorers=K, prune="none").generate(prompt, NEW)
        assert result.tokens == reference, f"K={K}"
        assert len(result.stats.matched_stages) == NEW
        # the round law of the unpruned lattice (a pruned match restarts its anchor): after a token matched at
        # stage k the next commits k + 1 rounds later, after a miss K rounds later; where a draft chain carried
        # on, as many rounds later as stages its chain slot still lacked: none when it started with its
        # predecessor, fewer than K when the chain grew later
        commits = [(e.round, c) for e in result.trace if isinstance(e, RoundEvent) for c in e.commits]
        assert [c.matched_stage for _, c in commits] == result.stats.matched_stages and commits[0][0] == K
        for (r, c), (later, _) in zip(commits, commits[1:]):
            gap = later - r
            assert (
                0 <= gap < K if c.via == "chain" else gap == (K if c.via == "root" else c.matched_stage + 1)
            )
        assert result.stats.rounds == commits[-1][0]


# each set on two families, once with DECS and once without; each family with DECS on and off
@pytest.mark.parametrize(
    "family_model,depths,decs",
    [
        on("llama", (1, 6), True),
        on("llama", (2, 3, 4, 6), False),
        on("mistral", (4, 5, 6), True),
        on("mistral", (1, 6), False),
        on("qwen2", (1, 2, 6), True),
        on("qwen2", (4, 5, 6), False),
        on("qwen3", (2, 3, 4, 6), True),
        on("qwen3", (1, 2, 6), False),
    ],
    indirect=["family_model"],
)
def test_greedy_dex_equals_hf_generate_for_non_uniform_sets(family_model, depths, decs):
    prompt = [5, 17, 3, 88, 40, 2, 61, 9, 33, 70, 12]
    reference = hf_greedy(family_model, prompt, NEW)
    result = DexDecoder(family_model, depths=depths, decs=decs).generate(prompt, NEW)
    assert result.tokens == reference


SAMPLING = [(1.0, None, None), (0.7, 20, None), (1.3, None, 0.9), (0.9, 10, 0.8)]  # temperature, top_k, top_p
SEEDS = (0, 1, 7)


# every family under every config; the seeds rotated across configs and families, not crossed with them
@pytest.mark.parametrize(
    "family_model,temperature,top_k,top_p,seed",
    [
        on(family, *config, SEEDS[(i + j) % len(SEEDS)])
        for i, family in enumerate(sorted(FAMILIES))
        for j, config in enumerate(SAMPLING)
    ],
    indirect=["family_model"],
)
def test_seeded_sampling_dex_equals_ar_generate(family_model, temperature, top_k, top_p, seed):
    prompt = [3, 14, 15, 92, 65, 35]
    sampling = {"temperature": temperature, "top_k": top_k, "top_p": top_p, "seed": seed}
    reference = ar_generate(family_model, prompt, NEW, **sampling)
    for K in (2, 4):
        result = DexDecoder(family_model, explorers=K).generate(prompt, NEW, **sampling)
        assert result.tokens == reference.tokens, f"K={K}"


def test_ar_generate_greedy_equals_hf_generate(family_model):
    prompt = [1, 2, 3, 4, 5, 6, 7]
    assert ar_generate(family_model, prompt, NEW).tokens == hf_greedy(family_model, prompt, NEW)


def test_different_seeds_give_different_samples(llama):
    prompt = [3, 14, 15, 92]
    decoder = DexDecoder(llama, explorers=3)
    outs = {tuple(decoder.generate(prompt, 16, temperature=1.0, seed=s).tokens) for s in range(4)}
    assert len(outs) == 4


def test_generation_stops_at_eos_and_includes_it(llama):
    prompt = [5, 6, 7]
    free = DexDecoder(llama, explorers=3).generate(prompt, 40)
    eos = free.tokens[9]
    first = free.tokens.index(eos)
    stopped = DexDecoder(llama, explorers=3).generate(prompt, 40, eos_token_id=eos)
    assert stopped.tokens == free.tokens[: first + 1]
    assert stopped.stats.stop == "eos"
    hf = llama.generate(
        torch.tensor([prompt]), do_sample=False, max_new_tokens=40, eos_token_id=eos, pad_token_id=eos
    )[0, 3:].tolist()
    assert hf[: first + 1] == stopped.tokens


def test_one_decoder_serves_several_calls(llama):
    decoder = DexDecoder(llama, explorers=4)
    a = decoder.generate([1, 2, 3], 20)
    b = decoder.generate([9, 8, 7, 6, 5], 20, temperature=1.0, seed=3)
    c = decoder.generate([1, 2, 3], 20)
    assert a.tokens == c.tokens == hf_greedy(llama, [1, 2, 3], 20)
    assert b.tokens == ar_generate(llama, [9, 8, 7, 6, 5], 20, temperature=1.0, seed=3).tokens


@pytest.mark.slow
def test_sampled_first_tokens_follow_the_model_softmax():
    """Chi-square goodness of fit of 1500 seeded first tokens against softmax(logits / T)."""
    model = tiny_model("llama", layers=4, vocab=12, seed=3)
    prompt, T = [1, 5, 7], 1.5
    with torch.no_grad():
        probs = torch.softmax(model(torch.tensor([prompt])).logits[0, -1] / T, dim=-1)
    decoder = DexDecoder(model, explorers=2, trace_top=0)
    n = 1500
    counts = torch.zeros(12, dtype=torch.float64)
    for seed in range(n):
        counts[decoder.generate(prompt, 1, temperature=T, seed=seed).tokens[0]] += 1
    expected = probs * n
    assert expected.min() > 5  # the test's own premise for the chi-square approximation
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    p_value = float(torch.special.gammaincc(torch.tensor(11 / 2), torch.tensor(chi2 / 2)))
    assert p_value > 1e-3, (chi2, counts.tolist(), expected.tolist())
    # and the counts are not degenerate: every token of the vocabulary was drawn
    assert (counts > 0).all()


PIPELINE_SAMPLED = {"temperature": 0.8, "top_k": 20, "top_p": 0.9, "seed": 7}


# each of the two (K, sampling) cases on two families
@pytest.mark.parametrize(
    "family_model,K,sampling",
    [
        on("llama", 2, {}),
        on("mistral", 4, PIPELINE_SAMPLED),
        on("qwen2", 4, PIPELINE_SAMPLED),
        on("qwen3", 2, {}),
    ],
    indirect=["family_model"],
)
def test_ar_through_the_stages_equals_the_ar_reference_in_k_rounds_per_token(
    family_model, K, sampling, tmp_path
):
    """``pipeline=True``: no stage but the last proposes, so each token walks all K stages (K rounds), nothing
    speculative runs (no DECS mask or chain, though the decoder has chains on), and the trace says so and loads."""
    from dex_core.trace.files import load_trace, save_trace

    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    decoder = DexDecoder(family_model, explorers=K, draft="gate=0")
    got = decoder.generate(prompt, 12, pipeline=True, **sampling)
    assert got.tokens == ar_generate(family_model, prompt, 12, **sampling).tokens
    assert got.stats.rounds == 12 * K and got.stats.matched_stages == [K - 1] * 12 and got.stats.drafted == 0
    assert got.stats.batch_sizes[: 2 * K] == [[int(k == r % K) for k in range(K)] for r in range(2 * K)]
    start, rounds = got.trace[0], [e for e in got.trace if isinstance(e, RoundEvent)]
    assert (
        start.pipeline is True
        and start.decs is False
        and start.draft is None
        and "draft" not in start.record()
    )
    assert all(n.token == -1 and n.top == [] for e in rounds for n in e.nodes if n.stage < K - 1)
    save_trace(tmp_path / "pipeline.json", got.trace)
    assert load_trace(tmp_path / "pipeline.json")[0] == got.trace
    assert decoder.generate(prompt, 12, **sampling).tokens == got.tokens  # the same decoder runs DEX after it
