"""The DEX round loop: the paper's Algorithm 1, shared by every schedule (they differ only in the link).

Each round the lattice plans its nodes, every explorer this process runs expands its batch and chooses its tokens
(``runtime.stage``), the link shares every stage's choices, the lattice takes them in, and while the anchor has
all K stages its final token is committed and the lattice, the explorers' caches, the link and the sampler
collapse onto the branch that survives; a participant's request to stop ends the run after the round
(``stop_if_cancelled``). ``run_rounds`` yields one trace event per round, then the end event; timing (the run's clock,
read after the round and counted in the stats by ``account``) and tracing observe the steps from outside the loop.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial

from ..algorithm.chains import ChainPlanner
from ..algorithm.lattice import Collapse, Commit, Lattice, RoundPlan
from ..algorithm.sampling import Sampler
from ..model.explorer import Explorer
from ..model.view import ModelView
from ..trace.build import collapse_record, commit_record, end_event, node_record, round_event, round_timings
from ..trace.events import EndEvent, RoundEvent
from ..trace.stats import GenerationStats
from .clock import Clock
from .links import Link
from .readback import Choice, StageOutput
from .request import Request
from .settings import RunSettings
from .stage import Choosing, batch_of, choose_round, expand

Outputs = dict[int, StageOutput]  # stage index -> what that explorer produced this round


@dataclass
class Run:
    """One request as the loop works on it: what it runs on, and what it has made so far."""

    view: ModelView
    settings: RunSettings
    explorers: list[Explorer]  # the ones this process runs (all, or one per process)
    link: Link  # LocalLink or DistLink
    request: Request
    lattice: Lattice
    sampler: Sampler
    clock: Clock
    stats: GenerationStats
    tokens: list[int] = field(default_factory=list)
    communication: float = 0.0  # the link's waiting seconds already reported
    begun: object = None  # the clock's stamp at the start
    reader: float = 0.0  # the seconds the run waited for its reader, read so far (``handed``)
    overlap: bool = False  # a round's record made once the next round's steps are enqueued (``overlaps``)
    choosing: Choosing | None = None  # what its token choice reads of it (``stage.Choosing``)
    prune: int | None = (
        None  # its row budget this round: the settings', or its share of shared rounds' (``crew``)
    )

    @property
    def finished(self) -> bool:
        return self.stats.stop != "running" or len(self.tokens) >= self.request.options.max_new_tokens


def run_rounds(
    view: ModelView, settings: RunSettings, explorers: list[Explorer], link: Link, request: Request
) -> Iterator[RoundEvent | EndEvent]:
    """Algorithm 1: yields one trace event per round (its tokens without text: ``trace.build.with_text``), then the
    end event. On an accelerator (``overlaps``) a round's record is made, and yielded, once the next round's stage
    steps are enqueued: the device runs them meanwhile. On the CPU, where a step runs as it is called, each round's
    event reaches the consumer before the next round's first step."""
    run = start(view, settings, explorers, link, request)  # S <- init(x, {E_k}): the prompt's prefill
    done = None  # a round decided, its record not yet made
    while not run.finished:
        with run.clock.span("round"):
            plan = plan_round(run)  # the nodes (ETKs) of FSM state q, by stage
            masked = decs_masks(run, plan)  # DECS: the tokens shallower stages of each slot proposed
            choices = explore(run, plan, masked)  # expand every batch, choose its tokens on the device
        if done is not None:  # (accelerators) the last round's record while this round's steps run
            yield from handed(run, recorded(run, done))
        with run.clock.span("round"):
            done = decide(run, plan, masked, choices)  # exchange, insert, commit and collapse
        if not run.overlap:
            yield from handed(run, recorded(run, done))
            done = None
    if done is not None:
        yield from handed(run, recorded(run, done))
    run.reader += run.clock.seconds(READER)
    yield ended(run, run.reader)


def decide(run: Run, plan: RoundPlan, masked: dict, choices: dict[int, Choice]) -> Decided:
    """The rest of a round once its stages chose (Algorithm 1's lines after the expansion): every stage's choices
    shared, taken into the lattice, and while the anchor has all K stages its token committed and the lattice, the
    caches, the link and the sampler collapsed onto the branch that survives."""
    outputs = run.link.exchange(plan, choices)  # H_q, Z_q: every stage's choices, on every rank
    insert(run, plan, outputs)  # B <- insert(B, Z_q)
    commits = []
    while run.lattice.ready() and not run.finished:  # ReachFinalDepth(q); a chain may go on
        commit = validate_and_commit(run)  # (b, y) <- validate_and_commit(B); Y <- Y || y
        commits.append((commit, collapse(run, commit)))  # (B, S, q) <- collapse(B, S, q, b)
    stop_if_cancelled(run)  # a participant asked to stop: this round is the last
    return decided(run, plan, outputs, masked, commits)


def ended(run: Run, reader: float | None) -> EndEvent:
    """The run's end event, its stats finished: ``reader`` of its wall seconds were its reader's, not the model's;
    None: all but those of its rounds and its prefill (a run sharing its rounds with others: ``runtime.crew``)."""
    account_rest(run)
    stats, wall = run.stats, run.clock.since(run.begun)
    if reader is None:
        reader = wall - min(stats.round_seconds + stats.prefill_seconds, wall)
    stats.finish(len(run.tokens), wall, reader)
    return end_event(run.tokens, stats)


READER = "reader"  # the clock's span of the time a round's event is with the loop's reader


def handed(run: Run, event: RoundEvent) -> Iterator[RoundEvent]:
    """Hand ``event`` to the loop's reader, timing how long the run waits for it (the page drawing a round, a
    client reading its stream): ``GenerationStats`` leaves that out of the model's seconds. On CUDA the span's
    two events sit next to each other on the stream, so it counts only the device's idle wait for the reader, not
    the queued steps it ran meanwhile."""
    with run.clock.span(READER):
        yield event


def overlaps(view: ModelView) -> bool:
    """Whether a round's record waits for the next round's stage steps to be enqueued: on an accelerator, whose
    steps run while the host records (``benchmarks/round_host_work.py --order accelerator`` sets it on the CPU)."""
    return view.device.type != "cpu"


@dataclass(frozen=True)
class Decided:
    """A round as the loop decided it: what its record needs, the lattice's part read before the next round."""

    plan: RoundPlan
    outputs: Outputs
    masked: dict
    commits: list
    first: int  # the index of its first commit among the run's tokens
    state: int  # the FSM state after it
    alive: list[int]
    cut: list[int] | None


def decided(run: Run, plan: RoundPlan, outputs: Outputs, masked: dict, commits: list) -> Decided:
    """The round just decided, with what its record reads of the lattice before the next round changes it."""
    lattice = run.lattice
    cut = list(lattice.cut) if lattice.chains is not None else None
    first = len(run.tokens) - len(commits)
    return Decided(plan, outputs, masked, commits, first, lattice.state, list(lattice.nodes), cut)


def recorded(run: Run, done: Decided) -> RoundEvent:
    """The round's trace event, its timings read once it is made (``round_seconds``) and counted in the stats."""
    with run.clock.span("round"):
        event = round_record(run, done)
    event = dataclasses.replace(event, timings=round_seconds(run, done.outputs))
    account(run, event.timings, done.plan)
    return event


def start(view, settings: RunSettings, explorers, link: Link, request: Request) -> Run:
    """A fresh run: caches and link reset, the prompt (all but its last token) through every stage."""
    run = begin(view, settings, explorers, link, request)
    with run.clock.span(
        "prefill"
    ):  # the caches' reset too: the prefill span and the rounds' tile the run's seconds
        reset(run)
        prompt = list(request.prompt)
        if len(prompt) > 1:
            link.prefill(explorers, view, prompt[:-1])
    return run


def begin(view, settings: RunSettings, explorers, link: Link, request: Request) -> Run:
    """The run of ``request`` before its prefill: lattice, sampler, clock and stats (its caches as they are)."""
    o, prompt = request.options, list(request.prompt)
    clock = Clock(view.device)
    run = Run(
        view=view,
        settings=settings,
        explorers=explorers,
        link=link,
        request=request,
        lattice=Lattice(
            settings.K,
            prompt[-1],
            len(prompt),
            None
            if settings.draft is None or request.pipeline
            else ChainPlanner(settings.draft, prompt, len(prompt) + o.max_new_tokens - 1),
        ),
        sampler=Sampler(view.vocab, o.temperature, o.top_k, o.top_p, o.seed),
        clock=clock,
        overlap=overlaps(view),
        stats=GenerationStats(settings.K, list(settings.depths), compute_seconds=[0.0] * settings.K),
    )
    run.begun, run.prune = clock.stamp(), settings.prune
    run.choosing = Choosing(
        run.sampler, settings.trace_top, settings.prune is not None, request.logprobs, clock
    )
    return run


def reset(run: Run) -> None:
    """The run's caches emptied and sized once for its prompt and new tokens, its link's rows dropped."""
    # a stage's lattice entries and rows in a round, at most: budget x K (benchmarks/lattice_bound.py: 18 of 18 runs
    # within it); past it the cache grows, logged once (model.cache)
    settings, request = run.settings, run.request
    lattice = None if settings.prune is None else settings.prune * settings.K
    for e in run.explorers:
        e.reset(len(request.prompt) + request.options.max_new_tokens, lattice)
    run.link.reset()


def plan_round(run: Run) -> RoundPlan:
    with run.clock.span("plan"):
        return run.lattice.plan_round(run.prune)


def decs_masks(run: Run, plan: RoundPlan) -> dict[int, list[int]]:
    """Node id -> the tokens DECS masks at it: its slot's shallower candidates (never at the final stage)."""
    final, decs = run.settings.K - 1, run.settings.decs and not run.request.pipeline
    return {
        n.id: run.lattice.prior_tokens(n) if decs and n.stage < final else []
        for batch in plan.batches
        for n in batch
    }


def explore(run: Run, plan: RoundPlan, masked: dict[int, list[int]]) -> dict[int, Choice]:
    """Every explorer this process runs expands its batch; then they choose their tokens (those sharing a head
    together), on their devices, for the link to read."""
    expanded = {e.index: explored(run, e, plan) for e in run.explorers if plan.batches[e.index]}
    with run.clock.span("decode"):
        return choose_round(run.choosing, run.explorers, plan, expanded, masked)


def explored(run: Run, e: Explorer, plan: RoundPlan) -> tuple:
    """Explorer ``e``'s batch of the round through its stage (``stage.expand``): its output rows and candidate
    logits. Its mask table goes to the device just before its step (``stage.batch_of``)."""
    nodes = plan.batches[e.index]
    with run.clock.span("masks"):
        batch = batch_of(e, nodes, [run.lattice.slots[n.slot].path for n in nodes], run.view.device)
    with run.clock.span(("expand", e.index)):
        if e.index == 0:
            hidden = run.view.embed(batch.tokens)
        else:
            hidden = run.link.inputs([n.parent for n in nodes], batch.rows)
        post = None if e.final else partial(run.link.post, plan, e.index)
        return expand(e, batch, hidden, post, e.final or not run.request.pipeline)


def insert(run: Run, plan: RoundPlan, outputs: Outputs) -> None:
    """The round's candidates (and their probabilities) into the lattice; rows of cut chain slots dropped."""
    with run.clock.span("plan"):
        tokens = {n.id: t for k, out in outputs.items() for n, t in zip(plan.batches[k], out.tokens)}
        probs = {n.id: p for k, out in outputs.items() for n, p in zip(plan.batches[k], out.probs or [])}
        run.lattice.insert(tokens, probs)
        if run.lattice.cut:
            run.link.keep(run.lattice.nodes)


def validate_and_commit(run: Run) -> Commit:
    """Commit the anchor's final-depth token (the token AR emits there)."""
    with run.clock.span("commit"):
        commit = run.lattice.validate_and_commit()
    run.tokens.append(commit.token)
    run.stats.matched_stages.append(commit.matched_stage)
    run.stats.drafted += commit.drafted
    if commit.token in run.request.eos:
        run.stats.stop = "eos"
    return commit


def collapse(run: Run, commit: Commit) -> Collapse:
    """Keep the surviving branch in the lattice, every explorer's KV cache, the link's rows and the sampler."""
    with run.clock.span("collapse"):
        kept = run.lattice.collapse(commit)
        for e in run.explorers:
            e.cache.commit(commit.anchor_slot, kept.kept_slots)
        run.link.keep(run.lattice.nodes)
        run.sampler.forget_before(commit.position + 1)
    return kept


def stop_if_cancelled(run: Run) -> None:
    """End the run after this round when a participant asked to stop (the link says so after its exchange)."""
    if run.link.cancelled:
        run.stats.stop = "cancelled"


def round_record(run: Run, done: Decided) -> RoundEvent:
    """The round's trace event (its timings added once the round is over: ``round_seconds``)."""
    with run.clock.span("trace"):
        plan, outputs, masked = done.plan, done.outputs, done.masked
        nodes = [
            node_record(n, [[t, round(p, 4)] for t, p in out.top[i]], masked[n.id])
            for k, out in outputs.items()
            for i, n in enumerate(plan.batches[k])
        ]
        records = [
            commit_record(c, done.first + i, **at_final_depth(plan, outputs, c))
            for i, (c, _) in enumerate(done.commits)
        ]
        collapsed = collapse_record(done.commits)
        return round_event(plan, done.state, sorted(done.alive), done.cut, nodes, records, collapsed)


def at_final_depth(plan: RoundPlan, outputs: Outputs, commit: Commit) -> dict:
    """What the committed final-depth node says of its token: its top-1 minus top-2 score, its tie gap and whether
    it is a near-tie; its log-probability and the likeliest alternatives when the request asks."""
    final = outputs.get(len(plan.batches) - 1)
    margins, gaps = (final.margins or [], final.tie_gaps or []) if final else ([], [])
    for i, (n, m, gap) in enumerate(zip(plan.batches[-1], margins, gaps)):
        if n.id == commit.anchor_nodes[-1]:
            said = {"margin": m, "near_tie": m <= gap, "tie_gap": gap}
            if final.logprobs is not None:
                said["logprob"], said["top_logprobs"] = final.logprobs[i]
            return said
    return {}


SPANS = ("prefill", "plan", "masks", "decode", "trace", "commit", "collapse", "round")


def round_seconds(run: Run, outputs: Outputs) -> dict:
    """The round's ``timings``: the clock's spans, read after the round without waiting for the device (on CUDA a
    span it has not passed yet counts in a later round's, or in ``account_rest``), each explorer's expansion (read
    with the round's choices) and the link's new waiting."""
    # the reader's spans too: their CUDA events are then recorded again, not made anew every round
    read = run.clock.read((*SPANS, READER), wait=False)
    run.reader += read.get(READER, 0.0)
    seconds = {name: read.get(name, 0.0) for name in SPANS}
    communication, run.communication = run.link.comm_seconds - run.communication, run.link.comm_seconds
    expand = [outputs[k].seconds if k in outputs else 0.0 for k in range(run.settings.K)]
    return round_timings(expand, communication=communication, **seconds)


def account_rest(run: Run) -> None:
    """Count in the run's stats the spans the device had not passed when the rounds were read (CUDA only)."""
    rest = run.clock.read()
    t = round_timings(
        [rest.get(("expand", k), 0.0) for k in range(run.settings.K)],
        communication=0.0,
        **{name: rest.get(name, 0.0) for name in SPANS},
    )
    run.stats.compute_seconds = [a + b for a, b in zip(run.stats.compute_seconds, t["expand"])]
    run.stats.bookkeeping_seconds += t["bookkeeping"]
    run.stats.round_seconds += t["round"]


def account(run: Run, timings: dict, plan: RoundPlan) -> None:
    """Count the round's ``timings`` and batch sizes in the run's stats."""
    run.stats.prefill_seconds += timings["prefill"]
    run.stats.add_round(timings, [len(b) for b in plan.batches])
