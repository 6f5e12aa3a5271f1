"""The cost model: what a token costs under each decoding method, counting all the work.

Unit: the *layer-equivalent* (LE), the weights of one decoder layer, so costs are hardware-neutral.
A model has L layers; its LM head (with the final norm) weighs ``head`` LE (the default model's tied
49152 x 576 head: 8.0 LE), an inducing adapter ``adapter`` LE (m = 2h: 0.38 LE). Two views, always
labelled:

- *memory-bound* (the paper's view, a GPU at small batch): a batched forward of n >= 1 rows costs
  what one row costs, as the weights are read once;
- *rows-counted* (a compute-bound CPU): a forward of n rows costs n times one row.

Explorer k of exploration set X = (d_0 < ... < d_{K-1} = L) runs layers (d_{k-1}, d_k], then proposes
with its head (non-final stages through their adapter, when there is one). A non-final stage's head is
the light proposal head when there is one (``dex_core.model.proposal``: N of the V rows, ``proposal`` =
head x N / V LE, e.g. 8192 rows: 1.33 LE), the final stage's always the full head. With n_k rows:

    c_k(n_k) = 0                                              if n_k = 0
             = (d_k - d_{k-1}) + head_k + adapter_k           memory-bound
             = n_k ((d_k - d_{k-1}) + head_k + adapter_k)      rows-counted

On K devices a round lasts as long as its slowest explorer: round = max_k c_k(n_k); on one device the
explorers run one after another: round = sum_k c_k(n_k). A run's cost per token is the sum over its
rounds divided by its tokens. Communication and the per-round fixed cost are seconds, not weights:
they belong to a measured profile, not to this count.

    AR:                        L + head per token (one row)
    self-speculation (E, n):   per draft-verify step, memory-bound
                               n (E + head + adapter_E) + E + (L - E) + head
                               (n drafts through E layers and the head; the last draft's E layers;
                               the verifier's L - E layers and head over n + 1 rows, batched)
                               rows-counted: (n + 1) E + n (head + adapter_E) + (n + 1)(L - E + head)
"""

from __future__ import annotations

from dataclasses import dataclass

from .adapter_choice import AdapterSet

VIEWS = ("memory", "rows")


@dataclass(frozen=True)
class ModelCost:
    """Weights of a model's parts in layer-equivalents."""

    num_layers: int
    head: float  # LM head + final norm
    adapter: float  # one inducing adapter (0 without adapters)
    proposal: float | None = None  # a non-final stage's light proposal head (None: the full head)

    @classmethod
    def of(cls, model, adapters=None, proposal_rows: int | None = None) -> ModelCost:
        """Parameter counts of ``model``'s layers, head, (first) adapter and a light proposal head of
        ``proposal_rows`` rows (None or the vocabulary size: full), in layer-equivalents. ``model`` may be a
        skeleton on the meta device (only shapes are counted); ``adapters`` a mapping of modules or an
        ``AdapterSet``."""
        layers = model.model.layers
        per_layer = sum(p.numel() for p in layers.parameters()) / len(layers)
        norm = sum(p.numel() for p in model.model.norm.parameters())
        head = model.lm_head.weight.numel() + (
            model.lm_head.bias.numel() if model.lm_head.bias is not None else 0
        )
        if isinstance(adapters, AdapterSet):
            size = adapters.size
        else:
            adapter = next(iter((adapters or {}).values()), None)
            size = sum(p.numel() for p in adapter.parameters()) if adapter is not None else 0
        vocab = model.lm_head.out_features
        light = (
            None
            if proposal_rows is None or proposal_rows >= vocab
            else (head * proposal_rows / vocab + norm) / per_layer
        )
        return cls(len(layers), (head + norm) / per_layer, size / per_layer, light)

    @classmethod
    def from_weights(cls, num_layers: int, weights: dict | None) -> ModelCost:
        """The cost model a trace's start event records (``num_layers`` and ``cost``, see ``weights``);
        decoder layers only for a trace without ``cost``."""
        if not weights:
            return cls(num_layers, 0.0, 0.0)
        return cls(num_layers, weights["head"], weights["adapter"], weights["proposal"])

    def weights(self) -> dict:
        """The parts' weights in layer-equivalents, as the trace's start event records them (``cost``)."""
        return {"head": self.head, "adapter": self.adapter, "proposal": self.proposal}

    def ar(self) -> float:
        """One AR token: every layer and the head."""
        return self.num_layers + self.head

    def stage(self, depths, k: int, rows: int, view: str, adapter_depths=()) -> float:
        """c_k(rows): explorer k's cost in one round."""
        if view not in VIEWS:
            raise ValueError(f"view must be one of {VIEWS}; got {view!r}")
        if rows == 0:
            return 0.0
        layers = depths[k] - (depths[k - 1] if k else 0)
        final = k == len(depths) - 1
        head = self.head if final or self.proposal is None else self.proposal
        one = layers + head + (self.adapter if depths[k] in adapter_depths else 0.0)
        return one * (rows if view == "rows" else 1)

    def dex_round(self, depths, batch_sizes, view: str, adapter_depths=(), devices: str = "K") -> float:
        """One round with ``batch_sizes[k]`` rows at explorer k, on K devices (max) or on one (sum)."""
        costs = [self.stage(depths, k, n, view, adapter_depths) for k, n in enumerate(batch_sizes)]
        return max(costs) if devices == "K" else sum(costs)

    def dex(
        self, depths, rounds_batch_sizes, tokens: int, view: str, adapter_depths=(), devices: str = "K"
    ) -> float:
        """DEX's cost per token from its rounds' batch sizes (``GenerationStats.batch_sizes``)."""
        total = sum(self.dex_round(depths, b, view, adapter_depths, devices) for b in rounds_batch_sizes)
        return total / max(1, tokens)

    def dex_steady(self, depths, rounds_per_token: float, adapter_depths=()) -> float:
        """Memory-bound DEX cost per token at ``rounds_per_token``, an upper bound of ``dex``: every non-final
        explorer works in every round, the final explorer in at most one round per token. The final explorer
        only ever holds the commit position's row: a branch trails the row whose candidate started it by a
        stage, so it is collapsed before it can reach the final stage (``tests/analysis/test_cost.py`` checks this on
        runs). With a heavy LM head this is what keeps the count honest: the full head is read once per token,
        as in AR, not once per round."""
        stages = [self.stage(depths, k, 1, "memory", adapter_depths) for k in range(len(depths))]
        others = max(stages[:-1], default=0.0)
        final_rounds = min(1.0, rounds_per_token)
        return final_rounds * max(stages[-1], others) + (rounds_per_token - final_rounds) * others

    def self_spec_step(self, exit_layer: int, draft: int, view: str, with_adapter: bool = False) -> float:
        """One draft-verify step of self-speculation with exit E and n drafts (see the module docstring)."""
        a = self.adapter if with_adapter else 0.0
        L, E, n, head = self.num_layers, exit_layer, draft, self.head
        if view == "memory":
            return n * (E + head + a) + E + (L - E) + head
        if view == "rows":
            return (n + 1) * E + n * (head + a) + (n + 1) * (L - E + head)
        raise ValueError(f"view must be one of {VIEWS}; got {view!r}")

    def layers_only(self) -> ModelCost:
        """The same model counted by its layers alone (the head and adapters weigh nothing)."""
        return ModelCost(self.num_layers, 0.0, 0.0)

    def full_heads(self) -> ModelCost:
        """The same model with full heads at every stage (no light proposal heads)."""
        return ModelCost(self.num_layers, self.head, self.adapter)
