"""Tree-batch attention without ``repeat_kv``: the ``dex_sdpa`` attention implementation.

DEX calls each decoder layer with an explicit additive tree mask. With any mask, transformers'
``sdpa_attention_forward`` serves grouped-query attention by ``repeat_kv``: it copies every layer's whole KV
context ``n_rep`` times each round (about 67 MB a layer for a 70B model at 2k context), because SDPA's own
``enable_gqa`` falls back to the slow math kernel when a mask is given on CUDA. Here the copy goes the other way:
the ``n_rep`` query heads that share one KV head are stacked along the query axis,

    query (b, H, q, d) -> (b, Hkv, n_rep * q, d)      head h reads KV head h // n_rep, as in repeat_kv
    mask  (b, 1, q, k) -> (b, 1, n_rep * q, k)        the mask tiled n_rep times: q x k, not Hkv x k x d

so one plain SDPA call attends each group to its KV head, and the output is unstacked to transformers' layout
(b, q, H, d). Each score row still sees the same keys, mask row and scale, so the result is the same attention.

The fast path runs only for calls that carry ``dex_tree=True`` (the explorers' layer calls) and that it can
serve: a mask shared by all heads, grouped heads, and none of the extras SDPA itself handles differently
(``position_bias``) or refuses (``softcap``: Gemma 2's attention soft-capping) or that plain SDPA has no term
for (``s_aux``/``sinks``). ``sliding_window`` is no obstacle: SDPA ignores it, the mask holds the window. Every
other call (HF ``generate``, the AR reference, a family it cannot serve) goes to ``sdpa_attention_forward``
unchanged, and ``dex_sdpa`` builds its masks with SDPA's mask function, so such calls are bit-identical to
``sdpa``.
"""

from __future__ import annotations

import torch

TREE_ATTENTION = "dex_sdpa"
TREE_KWARG = "dex_tree"  # the layer-call keyword that asks for the grouped path
_UNSERVED = ("softcap", "position_bias", "s_aux", "sinks")  # kwargs whose presence sends a call to plain sdpa


def _groupable(module, query: torch.Tensor, key: torch.Tensor, mask: torch.Tensor | None, kwargs) -> bool:
    """Whether grouping query heads by KV head computes this call's attention exactly: a 4-D mask shared by
    all heads (the trick tiles it along the query axis), grouped heads whose counts match, no extra term."""
    n_rep = getattr(module, "num_key_value_groups", 1)
    return (
        n_rep > 1
        and query.shape[1] == key.shape[1] * n_rep
        and mask is not None
        and mask.dim() == 4
        and mask.shape[1] == 1
        and mask.shape[2] == query.shape[2]
        and all(kwargs.get(name) is None for name in _UNSERVED)
    )


def grouped_sdpa(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor,
    n_rep: int,
    dropout: float = 0.0,
    scaling: float | None = None,
) -> torch.Tensor:
    """Masked attention of H = Hkv * n_rep query heads on Hkv KV heads, without copying K or V.

    query (b, H, q, d), key (b, Hkv, k, d), value (b, Hkv, k, dv), mask (1 or b, 1, q, k) additive or boolean;
    returns (b, q, H, dv) contiguous, the layout of transformers' ``sdpa_attention_forward``."""
    b, heads, q, d = query.shape
    kv_heads = key.shape[1]
    grouped = query.reshape(b, kv_heads, n_rep * q, d)  # rows j * q + t: head kv * n_rep + j, token t
    tiled = mask.repeat(1, 1, n_rep, 1)  # (1 or b, 1, n_rep * q, k): row j * q + t is mask row t
    out = torch.nn.functional.scaled_dot_product_attention(
        grouped, key, value, attn_mask=tiled, dropout_p=dropout, scale=scaling
    )  # (b, Hkv, n_rep * q, dv)
    return out.reshape(b, heads, q, value.shape[-1]).transpose(1, 2).contiguous()


def tree_sdpa_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract, registered as ``dex_sdpa``: the grouped path for the calls
    marked ``dex_tree=True`` that it can serve, ``sdpa_attention_forward`` (bit for bit) for every other."""
    tree = kwargs.pop(TREE_KWARG, False)
    if tree and _groupable(module, query, key, attention_mask, kwargs):
        out = grouped_sdpa(query, key, value, attention_mask, module.num_key_value_groups, dropout, scaling)
        return out, None
    # deferred: transformers' modeling code is seconds to import (docs/ARCHITECTURE.md, Imports)
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward(
        module,
        query,
        key,
        value,
        attention_mask,
        dropout=dropout,
        scaling=scaling,
        is_causal=is_causal,
        **kwargs,
    )


def register_tree_attention() -> None:
    """Register ``dex_sdpa`` with transformers (idempotent): the attention function, and SDPA's own mask
    builder, without which transformers would build no padding or causal mask at all for a custom name."""
    # deferred: transformers' modeling code is seconds to import (docs/ARCHITECTURE.md, Imports)
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    AttentionInterface.register(TREE_ATTENTION, tree_sdpa_attention)
    AttentionMaskInterface.register(TREE_ATTENTION, sdpa_mask)


def use_tree_attention(model) -> bool:
    """Switch a model on ``sdpa`` to ``dex_sdpa`` (idempotent) and say whether it now runs it. Eager, flash
    and the other implementations are left as they are (False): their layers must not get ``dex_tree``."""
    implementation = model.config._attn_implementation
    if implementation not in ("sdpa", TREE_ATTENTION):
        return False
    register_tree_attention()
    if implementation == "sdpa":
        model.set_attn_implementation(TREE_ATTENTION)
    return model.config._attn_implementation == TREE_ATTENTION
