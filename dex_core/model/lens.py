"""The logit lens: what every layer proposes for each generated token (paper §2; the app's depth view).

One forward pass over prompt + generated tokens gives every layer's hidden state at every generated
position t. Layer l < L proposes through LM head(final norm(adapter_l(h_l))) — an inducing adapter
where one is given, the plain lens elsewhere — and layer L is the model's own output. From those logits:

- ``layer_candidates``: each layer's ranked top candidates (what ``dex_core.analysis.ead`` replays DEX on; a
  shortlist restricts the layers below the last to a light proposal head's tokens);
- ``depth_view``: per token and layer, the committed token's probability and rank and the layer's
  top-k with probabilities (the Analysis tab's heatmap).
"""

from __future__ import annotations

import torch

from .proposal import ProposalHead
from .view import model_view

TOP = 8  # ranked candidates kept per layer: DECS at stage k needs at most k + 1 of them (K <= 8)


@torch.no_grad()
def _layer_logits(model, prompt: list[int], tokens: list[int], adapters=None, shortlist=None):
    """Yield (layer, logits (T, vocab)) for layers 1..L at the generated positions; with ``shortlist`` the layers
    below L score only its ids (T, N), through the light proposal head DEX runs (N rows read, not V)."""
    view = model_view(model)
    adapters = adapters or {}
    light = None if shortlist is None else ProposalHead(view, shortlist)
    ids = torch.tensor([prompt + tokens[:-1]], device=view.device)
    hidden = model(ids, output_hidden_states=True).hidden_states  # L + 1 of (1, n, h); last is normed
    first = len(prompt) - 1
    for layer in range(1, view.num_layers + 1):
        h = hidden[layer][0, first:]  # (T, h)
        if layer == view.num_layers:
            yield layer, view.finish(model.lm_head(h))
        else:
            h = adapters[layer](h) if layer in adapters else h
            yield layer, view.head(h) if light is None else light(h)


def layer_candidates(
    model,
    prompt: list[int],
    tokens: list[int],
    adapters=None,
    top: int = TOP,
    shortlist: torch.Tensor | None = None,
) -> torch.Tensor:
    """Each layer's ``top`` best candidates for each generated position: long tensor (T, L, top).
    With ``shortlist`` (token ids of a light proposal head) layers below the last rank only those."""
    out = []
    L = model_view(model).num_layers
    for layer, logits in _layer_logits(model, prompt, tokens, adapters, shortlist):
        indices = logits.topk(top, dim=-1).indices.cpu()
        out.append(shortlist.cpu()[indices] if shortlist is not None and layer < L else indices)
    return torch.stack(out, dim=1)


def depth_view(model, prompt: list[int], tokens: list[int], adapters=None, top: int = 5) -> dict:
    """JSON-ready: ``prob[t][l]`` and ``rank[t][l]`` (0 = top) of ``tokens[t]`` at layer l + 1, and
    ``top[t][l]`` = [[token, probability], ...] of that layer, best first."""
    target = torch.as_tensor(tokens, device="cpu")  # the probabilities below are brought to the host
    prob, rank, best = [], [], []
    for _, logits in _layer_logits(model, prompt, tokens, adapters):
        p = torch.softmax(logits.float(), dim=-1).cpu()
        mine = p.gather(1, target[:, None])[:, 0]
        prob.append(mine.tolist())
        rank.append((p > mine[:, None]).sum(dim=1).tolist())
        values, ids = p.topk(top, dim=-1)
        best.append(
            [
                [[int(i), round(float(v), 4)] for i, v in zip(row_ids, row_values)]
                for row_ids, row_values in zip(ids, values)
            ]
        )
    T = len(tokens)
    return {
        "num_layers": len(prob),
        "tokens": list(tokens),
        "adapter_depths": sorted(adapters or {}),
        "prob": [[round(prob[layer][t], 5) for layer in range(len(prob))] for t in range(T)],
        "rank": [[rank[layer][t] for layer in range(len(rank))] for t in range(T)],
        "top": [[best[layer][t] for layer in range(len(best))] for t in range(T)],
    }
