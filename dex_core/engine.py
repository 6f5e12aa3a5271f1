"""The DEX round loop (shared by every schedule), DexDecoder, and the AR reference (same sampler).

Each round: the lattice plans the nodes to compute, every explorer expands its batch (stage forward,
candidate proposal, token choice), the lattice records the candidates, and once the anchor has all K
stages the final-stage token is committed and every explorer's cache collapses onto the matched
subtree. ``DexDecoder.stream`` yields one trace event per round; ``generate`` collects them.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from .config import DexConfig, DexError, check_backend, check_sampling, resolve_depths
from .explorer import Explorer
from .lattice import Lattice
from .models import ModelView, model_view
from .sampling import Sampler
from .trace import TRACE_VERSION, collapse_record, commit_record, node_record
from .transport import LocalLink, StageOutput

_D = DexConfig  # defaults come from the one config


@dataclass
class GenerationStats:
    explorers: int
    depths: list[int]
    tokens: int = 0
    rounds: int = 0
    rounds_per_token: float = 0.0
    depth_speedup: float = 0.0  # K / (rounds/token); AR through K stages = 1
    matched_stages: list[int] = field(default_factory=list)  # per committed token
    batch_sizes: list[list[int]] = field(default_factory=list)  # per round, per explorer
    compute_seconds: list[float] = field(default_factory=list)  # per explorer, expansion only
    bookkeeping_seconds: float = 0.0  # plan + masks + commit + collapse
    communication_seconds: float = 0.0  # waiting on other explorers (distributed schedule)
    round_seconds: float = 0.0  # all rounds, end to end
    projected_seconds: float = 0.0  # prefill + sum over rounds of (slowest explorer + bookkeeping)
    prefill_seconds: float = 0.0
    wall_seconds: float = 0.0
    tokens_per_second: float = 0.0
    stop: str = "length"  # "length" | "eos" | "cancelled"

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def bookkeeping_share(self) -> float:
        return self.bookkeeping_seconds / self.round_seconds if self.round_seconds else 0.0

    def matched_histogram(self) -> list[int]:
        counts = [0] * self.explorers
        for k in self.matched_stages:
            counts[k] += 1
        return counts


@dataclass
class GenerationResult:
    tokens: list[int]  # new tokens only; includes the EOS token when generation stopped there
    stats: GenerationStats
    trace: list[dict]


def _prompt_ids(input_ids, vocab: int) -> list[int]:
    if isinstance(input_ids, torch.Tensor):
        if input_ids.dim() == 2:
            if input_ids.shape[0] != 1:
                raise DexError(f"DEX decodes one sequence at a time; got a batch of {input_ids.shape[0]}")
            input_ids = input_ids[0]
        ids = [int(t) for t in input_ids.tolist()]
    else:
        ids = [int(t) for t in input_ids]
    if not ids:
        raise DexError("the prompt is empty; give at least one token to continue from")
    bad = [t for t in ids if not 0 <= t < vocab]
    if bad:
        raise DexError(f"prompt token ids must lie in [0, {vocab}); got {bad[:5]}")
    return ids


def _check_request(view: ModelView, prompt: list[int], max_new_tokens, temperature, top_k, top_p) -> None:
    if not isinstance(max_new_tokens, int) or max_new_tokens <= 0:
        raise DexError(f"max_new_tokens must be a positive integer; got {max_new_tokens!r}")
    if view.max_positions and len(prompt) + max_new_tokens > view.max_positions:
        raise DexError(f"the prompt ({len(prompt)} tokens) plus max_new_tokens ({max_new_tokens}) exceeds "
                       f"the model's context window of {view.max_positions} tokens; ask for fewer tokens")
    check_sampling(temperature, top_k, top_p)


def _eos_ids(model, eos_token_id) -> set[int]:
    if eos_token_id is None:
        eos_token_id = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if eos_token_id is None:
        return set()
    return {int(eos_token_id)} if isinstance(eos_token_id, int) else {int(t) for t in eos_token_id}


def _start_event(method, depths, num_layers, prompt, max_new_tokens, temperature, top_k, top_p, seed, decs):
    return {"event": "start", "version": TRACE_VERSION, "method": method, "explorers": len(depths),
            "depths": list(depths), "num_layers": num_layers, "prompt": prompt,
            "max_new_tokens": max_new_tokens, "decs": decs,
            "sampling": {"temperature": temperature, "top_k": top_k, "top_p": top_p, "seed": seed}}


def _expand_stage(e: Explorer, batch, lattice: Lattice, link, view: ModelView, sampler: Sampler,
                  decs: bool, trace_top: int, timings: dict) -> StageOutput:
    """One explorer's work in one round: stage forward, candidate logits, token choice."""
    tic = time.perf_counter()
    if e.index == 0:
        h_in = view.embed(torch.tensor([n.input_token for n in batch], device=view.device))
    else:
        h_in = link.inputs([n.parent for n in batch])
    mask_before = e.mask_seconds
    h_out = e.expand(h_in, [n.slot for n in batch], [n.position - 1 for n in batch],
                     [lattice.slots[n.slot].path for n in batch])  # (n, hidden)
    logits = e.propose(h_out)  # (n, vocab)
    masks = e.mask_seconds - mask_before
    timings["masks"] += masks
    seconds = time.perf_counter() - tic - masks
    tic = time.perf_counter()
    masked = [lattice.prior_tokens(n) if decs and not e.final else [] for n in batch]
    picked = sampler.choose(logits, [n.position for n in batch], e.final, masked).tolist()
    if trace_top:
        scores = logits if sampler.greedy else logits / sampler.temperature
        probs, ids = torch.softmax(scores.float(), dim=-1).topk(trace_top, dim=-1)
    else:
        probs, ids = torch.empty(len(batch), 0), torch.empty(len(batch), 0, dtype=torch.long)
    timings["decode"] += time.perf_counter() - tic
    return StageOutput(picked, ids, probs, None if e.final else h_out, seconds)


def run_rounds(view: ModelView, depths, explorers: list[Explorer], link, prompt: list[int],
               max_new_tokens: int, sampler: Sampler, eos: set[int], decs: bool, trace_top: int,
               text=None) -> Iterator[dict]:
    """The round loop, shared by every schedule: yields one event per round, then the end event.

    ``explorers`` are the ones this process runs (all of them in the sequential schedule, one per
    process in the distributed one); ``link`` moves hidden states and candidates between them.
    """
    K = len(depths)
    stats = GenerationStats(K, list(depths), compute_seconds=[0.0] * K)
    start = time.perf_counter()
    for e in explorers:
        e.reset()
    link.reset()
    if len(prompt) > 1:
        link.prefill(explorers, view, prompt[:-1])
    stats.prefill_seconds = stats.projected_seconds = time.perf_counter() - start
    lattice = Lattice(K, prompt[-1], len(prompt))
    tokens: list[int] = []
    while True:
        t_round = time.perf_counter()
        timings = {"expand": [0.0] * K, "communication": 0.0, "decode": 0.0, "masks": 0.0,
                   "plan": 0.0, "commit": 0.0, "collapse": 0.0, "trace": 0.0,
                   "prefill": 0.0 if tokens or lattice.rounds else stats.prefill_seconds}
        plan = lattice.plan_round()
        timings["plan"] += time.perf_counter() - t_round
        outputs = {e.index: _expand_stage(e, plan.batches[e.index], lattice, link, view, sampler, decs,
                                          trace_top, timings)
                   for e in explorers if plan.batches[e.index]}
        comm_before = link.comm_seconds
        outputs = link.exchange(plan, outputs)
        timings["communication"] = link.comm_seconds - comm_before
        tic = time.perf_counter()
        lattice.record({n.id: t for k, out in outputs.items() for n, t in zip(plan.batches[k], out.tokens)})
        timings["plan"] += time.perf_counter() - tic

        tic = time.perf_counter()
        records = []
        for k, out in outputs.items():
            timings["expand"][k] = out.seconds
            for i, n in enumerate(plan.batches[k]):
                top = [[int(t), round(float(p), 4)] for t, p in zip(out.top_ids[i], out.top_probs[i])]
                masked = lattice.prior_tokens(n) if decs and k < K - 1 else []
                records.append(node_record(n, text(n.token) if text else None, top, masked))
        timings["trace"] = time.perf_counter() - tic

        commit = collapse = None
        if lattice.ready():
            tic = time.perf_counter()
            cplan = lattice.commit()
            timings["commit"] = time.perf_counter() - tic
            tic = time.perf_counter()
            for e in explorers:
                e.cache.commit(cplan.committed_slot, cplan.kept_slots)
            link.keep(lattice.nodes)
            sampler.forget_before(cplan.position + 1)
            timings["collapse"] = time.perf_counter() - tic
            tokens.append(cplan.token)
            stats.matched_stages.append(cplan.matched_stage)
            commit = commit_record(cplan, len(tokens) - 1, text(cplan.token) if text else None)
            collapse = collapse_record(cplan)
            if cplan.token in eos:
                stats.stop = "eos"
        if link.cancelled:
            stats.stop = "cancelled"

        timings["round"] = time.perf_counter() - t_round
        bookkeeping = timings["masks"] + timings["plan"] + timings["commit"] + timings["collapse"]
        stats.rounds += 1
        stats.batch_sizes.append([len(b) for b in plan.batches])
        stats.compute_seconds = [a + b for a, b in zip(stats.compute_seconds, timings["expand"])]
        stats.bookkeeping_seconds += bookkeeping
        stats.communication_seconds += timings["communication"]
        stats.round_seconds += timings["round"]
        stats.projected_seconds += max(timings["expand"]) + bookkeeping + timings["decode"]
        yield {"event": "round", "round": plan.round, "state_before": plan.state_before,
               "state_after": lattice.state, "batches": [[n.id for n in b] for b in plan.batches],
               "nodes": records, "commit": commit, "collapse": collapse,
               "alive": sorted(lattice.nodes), "timings": timings}
        if stats.stop != "length" or len(tokens) >= max_new_tokens:
            break

    stats.tokens = len(tokens)
    stats.rounds_per_token = stats.rounds / max(len(tokens), 1)
    stats.depth_speedup = K / stats.rounds_per_token if tokens else 0.0
    stats.wall_seconds = time.perf_counter() - start
    stats.tokens_per_second = len(tokens) / stats.wall_seconds
    yield {"event": "end", "tokens": tokens, "stop": stats.stop, "stats": stats.to_dict()}


class DexDecoder:
    """Depth Exploration Decoding over a Hugging Face causal LM.

    ``depths`` is the exploration set (strictly increasing, ending at the model's layer count), or
    ``explorers`` = K asks for a uniform split. ``adapters`` maps non-final depths to modules applied
    to that depth's hidden state before the LM head (inducing adapters), or names an adapter file
    (``"default"``: the set shipped for the default model); they change only which branch survives,
    never the committed tokens. ``tokenizer`` (optional) adds token text to traces.

    ``backend="sequential"`` runs every explorer in this process, one after another each round.
    ``backend="distributed"`` starts K explorer processes on torch.distributed (one per device in
    ``devices``: default ``cuda:0..K-1`` when K GPUs are visible, else CPU with ``threads`` threads
    each); they stay up across calls until ``close()`` (or the end of a ``with`` block). Same API,
    same tokens, same trace events.
    """

    def __init__(self, model, depths=None, explorers: int | None = None, decs: bool = _D.decs,
                 adapters: Mapping | None = None, tokenizer=None, trace_top: int = _D.trace_top,
                 backend: str = _D.backend, devices=None, threads: int | None = _D.threads,
                 op_timeout: float = _D.op_timeout, start_timeout: float = _D.start_timeout):
        self.model = model
        self.view = model_view(model)
        self.depths = resolve_depths(self.view.num_layers, depths, explorers)
        self.decs = bool(decs)
        self.tokenizer = tokenizer
        self.trace_top = trace_top
        if isinstance(adapters, (str, Path)):  # a file ('default': the shipped set): use the depths it covers
            from .adapters import load_adapters

            adapters = {d: a for d, a in load_adapters(adapters, model).items() if d in self.depths[:-1]}
        self.adapters = dict(adapters or {})
        extra = sorted(set(self.adapters) - set(self.depths[:-1]))
        if extra:
            raise DexError(f"adapters given for depths {extra}; only the non-final explored depths "
                           f"{list(self.depths[:-1])} take adapters")
        check_backend(backend)
        self.backend = backend
        self.group = None
        if backend == "distributed":
            from .serve import ExplorerGroup

            self.group = ExplorerGroup(model, self.depths, self.adapters, devices=devices, threads=threads,
                                       decs=self.decs, trace_top=trace_top, op_timeout=op_timeout,
                                       start_timeout=start_timeout)
            self.explorers = []
        else:
            bounds = (0,) + self.depths
            self.explorers = [Explorer(self.view, k, self.K, bounds[k], bounds[k + 1],
                                       self.adapters.get(self.depths[k])) for k in range(self.K)]

    @property
    def K(self) -> int:
        return len(self.depths)

    def _text(self, token: int) -> str | None:
        return None if self.tokenizer is None else self.tokenizer.decode([token])

    def generate(self, input_ids, max_new_tokens: int = _D.max_new_tokens, temperature: float = _D.temperature,
                 top_k: int | None = _D.top_k, top_p: float | None = _D.top_p, seed: int = _D.seed,
                 eos_token_id=None) -> GenerationResult:
        trace = list(self.stream(input_ids, max_new_tokens, temperature, top_k, top_p, seed, eos_token_id))
        end = trace[-1]
        return GenerationResult(end["tokens"], GenerationStats(**end["stats"]), trace)

    @torch.no_grad()
    def stream(self, input_ids, max_new_tokens: int = _D.max_new_tokens, temperature: float = _D.temperature,
               top_k: int | None = _D.top_k, top_p: float | None = _D.top_p, seed: int = _D.seed,
               eos_token_id=None) -> Iterator[dict]:
        """Yield trace events: a start event, one event per round, and an end event with the stats."""
        view = self.view
        prompt = _prompt_ids(input_ids, view.vocab)
        _check_request(view, prompt, max_new_tokens, temperature, top_k, top_p)
        eos = _eos_ids(self.model, eos_token_id)
        yield _start_event("dex", self.depths, view.num_layers, prompt, max_new_tokens,
                           temperature, top_k, top_p, seed, self.decs)
        if self.group is not None:
            request = {"prompt": prompt, "max_new_tokens": max_new_tokens, "temperature": temperature,
                       "top_k": top_k, "top_p": top_p, "seed": seed, "eos": sorted(eos)}
            for event in self.group.run(request):
                yield self._add_text(event)
            return
        sampler = Sampler(view.vocab, temperature, top_k, top_p, seed)
        yield from run_rounds(view, self.depths, self.explorers, LocalLink(self.K), prompt, max_new_tokens,
                              sampler, eos, self.decs, self.trace_top, self._text)

    def _add_text(self, event: dict) -> dict:
        """Token text for events made by explorer processes (which hold no tokenizer)."""
        if self.tokenizer is not None and event["event"] == "round":
            for node in event["nodes"]:
                node["text"] = self._text(node["token"])
            if event["commit"]:
                event["commit"]["text"] = self._text(event["commit"]["token"])
        return event

    def close(self) -> None:
        """End the explorer processes of the distributed backend (a no-op for the sequential one)."""
        if self.group is not None:
            self.group.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def ar_generate(model, input_ids, max_new_tokens: int = _D.max_new_tokens, temperature: float = _D.temperature,
                top_k: int | None = _D.top_k, top_p: float | None = _D.top_p, seed: int = _D.seed,
                eos_token_id=None, tokenizer=None) -> GenerationResult:
    """Autoregressive reference: the model's own forward with a KV cache, DEX's sampler on its logits."""
    trace = list(ar_stream(model, input_ids, max_new_tokens, temperature, top_k, top_p, seed, eos_token_id,
                           tokenizer))
    return GenerationResult(trace[-1]["tokens"], GenerationStats(**trace[-1]["stats"]), trace)


def ar_stream(model, input_ids, max_new_tokens: int = _D.max_new_tokens, temperature: float = _D.temperature,
              top_k: int | None = _D.top_k, top_p: float | None = _D.top_p, seed: int = _D.seed,
              eos_token_id=None, tokenizer=None) -> Iterator[dict]:
    """``ar_generate`` as events: start, one ``token`` event per token, end.

    A token event's ``seconds`` is the generator's own compute time so far (time spent by the
    consumer between events is not counted), so AR can be raced against DEX in one process.
    """
    from transformers import DynamicCache

    view = model_view(model)
    prompt = _prompt_ids(input_ids, view.vocab)
    _check_request(view, prompt, max_new_tokens, temperature, top_k, top_p)
    eos = _eos_ids(model, eos_token_id)
    sampler = Sampler(view.vocab, temperature, top_k, top_p, seed)
    stats = GenerationStats(1, [view.num_layers], compute_seconds=[0.0])
    yield _start_event("ar", [view.num_layers], view.num_layers, prompt, max_new_tokens,
                       temperature, top_k, top_p, seed, False)
    try:
        cache = DynamicCache(config=model.config)
    except TypeError:
        cache = DynamicCache()
    cache_kwarg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    busy = 0.0
    ids = torch.tensor([prompt], device=view.device)
    tokens: list[int] = []
    while len(tokens) < max_new_tokens and stats.stop != "eos":
        tic = time.perf_counter()
        with torch.no_grad():
            logits = model(input_ids=ids, use_cache=True, **{cache_kwarg: cache}).logits[0, -1:]
        position = len(prompt) + len(tokens)
        token = int(sampler.choose(logits, [position], final=True)[0])
        sampler.forget_before(position)
        tokens.append(token)
        if token in eos:
            stats.stop = "eos"
        ids = torch.tensor([[token]], device=view.device)
        busy += time.perf_counter() - tic
        yield {"event": "token", "index": len(tokens) - 1, "position": position, "token": token,
               "text": None if tokenizer is None else tokenizer.decode([token]), "seconds": busy}
    stats.wall_seconds = stats.round_seconds = stats.compute_seconds[0] = stats.projected_seconds = busy
    stats.tokens = stats.rounds = len(tokens)
    stats.rounds_per_token = stats.depth_speedup = 1.0
    stats.tokens_per_second = len(tokens) / busy if busy else 0.0
    stats.matched_stages = [0] * len(tokens)
    yield {"event": "end", "tokens": tokens, "stop": stats.stop, "stats": stats.to_dict()}
