"""Gumbel rows keyed by (seed, position), top-k/top-p filtering and DECS masking."""

import torch

from dex_core.algorithm.sampling import Sampler, filter_logits, gumbel_row


def test_gumbel_rows_depend_only_on_seed_and_position():
    a, b = gumbel_row(3, 17, 50), gumbel_row(3, 17, 50)
    assert torch.equal(a, b)
    assert not torch.equal(a, gumbel_row(3, 18, 50)) and not torch.equal(a, gumbel_row(4, 17, 50))
    rows = torch.stack([gumbel_row(0, p, 4000) for p in range(5)])
    assert abs(float(rows.mean()) - 0.5772) < 0.03  # the Gumbel(0, 1) mean is Euler's gamma


def test_filters_match_transformers_warpers():
    from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

    scores = torch.randn(3, 40, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    ours = filter_logits(scores, 7, None)
    theirs = TopKLogitsWarper(7)(None, scores.clone())
    assert torch.equal(torch.isinf(ours), torch.isinf(theirs))
    for p in (0.3, 0.8, 0.95):
        ours = filter_logits(scores, None, p)
        theirs = TopPLogitsWarper(p)(None, scores.clone())
        assert torch.equal(torch.isinf(ours), torch.isinf(theirs)), p


def test_decs_masks_apply_to_proposals_and_the_same_noise_is_shared():
    logits = torch.tensor([[5.0, 4.0, 3.0, 0.0]] * 2)
    greedy = Sampler(4)
    assert greedy.choose(logits, [9, 9], final=False, masked=[[0], [0, 1]]).tolist() == [1, 2]
    sampler = Sampler(4, temperature=1.0, seed=5)
    same = sampler.choose(logits, [9, 9], final=True)
    assert same[0] == same[1]  # both rows at position 9 draw with one noise row
    assert torch.equal(sampler.noise([9], logits)[0], gumbel_row(5, 9, 4).float())


def test_top_k_applies_to_the_final_reference_only():
    logits = torch.tensor([[0.0, 0.1, 0.2, 3.0]])
    sampler = Sampler(4, temperature=1.0, top_k=1, seed=0)
    assert all(int(sampler.choose(logits, [p], final=True)) == 3 for p in range(50))
    assert {int(sampler.choose(logits, [p], final=False)) for p in range(200)} != {3}
