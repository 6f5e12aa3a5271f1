"""Earliest available depth (EAD, paper §2) of generated tokens and the speedups it predicts.

For each generated token y_t (greedy rule) and each layer l, the candidate at l is
argmax(LM head(final norm(adapter_l(h_l)))) — the logit lens, through an inducing adapter where one
is given. Omega(t, l) = [candidate == y_t], with Omega(t, L) = 1.

    EAD(t)        = min { l : Omega(t, l) }
    EAD_stab(t)   = min { l : Omega(t, n) for all n >= l }
    S_X           = L T / sum_t ceil_X(EAD_stab(t))          (paper Prop. 7; oracle S_EAD: X = [L])

DEX itself reuses the shallowest explored stage whose candidate matches, stable or not, so the
depth-side speedup a DEX run measures without DECS is K / mean_t (1 + min{k : Omega(t, d_k)});
``rounds_speedup`` reports that prediction next to the paper's ``speedup``.
"""

from __future__ import annotations

import torch

from .config import resolve_depths
from .models import model_view


@torch.no_grad()
def layer_matches(model, prompt: list[int], tokens: list[int], adapters=None) -> torch.Tensor:
    """Omega as a bool tensor (T, L): does layer l's candidate for position t equal tokens[t]?"""
    view = model_view(model)
    adapters = adapters or {}
    ids = torch.tensor([prompt + tokens[:-1]], device=view.device)
    hidden = model(ids, output_hidden_states=True).hidden_states  # L + 1 of (1, n, h); last is normed
    first = len(prompt) - 1
    target = torch.tensor(tokens, device=view.device)
    L = view.num_layers
    omega = torch.zeros(len(tokens), L, dtype=torch.bool)
    for layer in range(1, L):
        h = hidden[layer][0, first:]  # (T, h)
        if layer in adapters:
            h = adapters[layer](h)
        omega[:, layer - 1] = (view.head(h).argmax(-1) == target).cpu()
    omega[:, L - 1] = True
    return omega


def analyse(omega: torch.Tensor, explorers=range(2, 9)) -> dict:
    """EADs and predicted depth-side speedups for uniform exploration sets of each K."""
    T, L = omega.shape
    layers = torch.arange(1, L + 1)
    ead = torch.where(omega, layers, L + 1).min(dim=1).values  # (T,)
    # stable: the first layer after the last miss
    missed = torch.where(~omega, layers, 0).max(dim=1).values
    ead_stable = missed + 1
    predicted = []
    for K in explorers:
        if K > L:
            break
        depths = torch.tensor(resolve_depths(L, explorers=K))
        ceil = depths[torch.searchsorted(depths, ead_stable)]
        first_match = omega[:, depths - 1].float().argmax(dim=1)  # shallowest matching stage
        predicted.append({"explorers": K, "depths": depths.tolist(),
                          "speedup": L * T / int(ceil.sum()),
                          "rounds_speedup": K * T / int((first_match + 1).sum())})
    return {"num_layers": L, "tokens": T, "ead": ead.tolist(), "ead_stable": ead_stable.tolist(),
            "predicted": predicted, "oracle": L * T / int(ead_stable.sum())}


def readiness(model, prompt: list[int], tokens: list[int], adapters=None, explorers=range(2, 9)) -> dict:
    """``analyse(layer_matches(...))``: the JSON-ready EAD analysis of one generation."""
    return analyse(layer_matches(model, prompt, tokens, adapters), explorers)
