"""``GET /metrics`` of ``dex serve --http``: Prometheus text (``prometheus_client``, one registry per server).

Named after vLLM's metrics where one exists (``vllm:`` becomes ``dex:``):

- ``dex:request_success_total{finished_reason}`` — requests ended: ``stop``, ``length``, ``abort`` (the client
  left) or ``error`` (the run failed); ``dex:num_requests_running`` / ``dex:num_requests_waiting``;
- ``dex:prompt_tokens_total``, ``dex:generation_tokens_total``, ``dex:rounds_total``;
- histograms ``dex:time_to_first_token_seconds`` (from the request's arrival, its wait included),
  ``dex:time_per_output_token_seconds`` (the gap before each later token, as the server saw it: tokens of one
  round come together) and ``dex:e2e_request_latency_seconds``;
- speculative decoding, per depth: ``dex:spec_decode_num_accepted_tokens_per_stage_total{stage,depth}`` (tokens
  matched at each stage: the trace's matched-stage histogram; the final stage's are those DEX had to wait for),
  ``dex:spec_decode_num_draft_tokens_per_stage_total{stage,depth}`` (candidate tokens each stage proposed: its
  nodes), ``dex:spec_decode_num_accepted_tokens_total`` (the ``usage``'s ``accepted_prediction_tokens``) and
  llama.cpp's ``dex:mean_acceptance_length`` (tokens committed per round, over every run so far).
"""

from __future__ import annotations

import time

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from ..trace.events import Event, RoundEvent, StartEvent

REASONS = ("stop", "length", "abort", "error")
LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
CONTENT_TYPE = CONTENT_TYPE_LATEST


class Metrics:
    """The counters of one server; ``running``/``waiting``: callables; ``crew``: the decoder's runs that share
    rounds (``runtime.crew``), or None. The per-stage counters' labels come with the first run's start event (its stages
    and depths)."""

    def __init__(self, running, waiting, crew=None):
        self.registry = registry = CollectorRegistry()
        self.depths = []
        self.requests = Counter(
            "dex:request_success", "Requests ended, by why", ["finished_reason"], registry=registry
        )
        for reason in REASONS:
            self.requests.labels(reason)
        Gauge("dex:num_requests_running", "Requests running", registry=registry).set_function(running)
        Gauge("dex:num_requests_waiting", "Requests waiting", registry=registry).set_function(waiting)
        Gauge(
            "dex:rows_per_round", "Rows the last shared round ran, every request's", registry=registry
        ).set_function(lambda: crew.rows if crew is not None else 0)
        Gauge("dex:rounds_shared", "Rounds run with requests sharing them", registry=registry).set_function(
            lambda: crew.rounds if crew is not None else 0
        )
        self.prompt = Counter("dex:prompt_tokens", "Prompt tokens", registry=registry)
        self.generated = Counter("dex:generation_tokens", "Committed tokens", registry=registry)
        self.rounds = Counter("dex:rounds", "DEX rounds run", registry=registry)
        self.first = Histogram(
            "dex:time_to_first_token_seconds", "Arrival to first token", buckets=LATENCY, registry=registry
        )
        self.gap = Histogram(
            "dex:time_per_output_token_seconds",
            "Gap before each later token",
            buckets=LATENCY,
            registry=registry,
        )
        self.whole = Histogram(
            "dex:e2e_request_latency_seconds", "Arrival to end", buckets=LATENCY, registry=registry
        )
        per_stage = ["stage", "depth"]
        self.matched = Counter(
            "dex:spec_decode_num_accepted_tokens_per_stage",
            "Tokens matched at each stage",
            per_stage,
            registry=registry,
        )
        self.proposed = Counter(
            "dex:spec_decode_num_draft_tokens_per_stage",
            "Candidate tokens each stage proposed",
            per_stage,
            registry=registry,
        )
        self.accepted = Counter(
            "dex:spec_decode_num_accepted_tokens",
            "Committed tokens matched ahead of the final stage",
            registry=registry,
        )
        self.counts = {"tokens": 0, "rounds": 0}
        Gauge("dex:mean_acceptance_length", "Tokens committed per round", registry=registry).set_function(
            lambda: self.counts["tokens"] / max(1, self.counts["rounds"])
        )

    def know(self, depths) -> None:
        """The decoder's depths (a start event's): each stage's counters shown from now on, at 0 until counted."""
        if list(depths) != self.depths:
            self.depths = list(depths)
            for stage, depth in enumerate(self.depths):
                self.matched.labels(str(stage), str(depth))
                self.proposed.labels(str(stage), str(depth))

    def round(self, event: RoundEvent) -> None:
        """A round event of a run: its commits and its nodes counted."""
        self.rounds.inc()
        self.counts["rounds"] += 1
        K = len(self.depths)
        for node in event.nodes:
            if node.token >= 0:
                self.proposed.labels(str(node.stage), str(self.depths[node.stage])).inc()
        for commit in event.commits:
            stage = commit.matched_stage
            self.matched.labels(str(stage), str(self.depths[stage])).inc()
            self.generated.inc()
            self.counts["tokens"] += 1
            if stage < K - 1 or commit.drafted:
                self.accepted.inc()

    def start(self, prompt: int, arrived: float) -> Tally:
        """One request's tally: ``prompt`` tokens, arrived at ``arrived`` (``time.monotonic()``)."""
        return Tally(self, prompt, arrived)

    def text(self) -> bytes:
        return generate_latest(self.registry)


class Tally:
    """One request's part in ``Metrics``: its rounds as they come (the time of each commit kept), then its end."""

    def __init__(self, metrics: Metrics, prompt: int, arrived: float):
        self.metrics, self.prompt, self.arrived, self.times, self.done = metrics, prompt, arrived, [], False

    def see(self, event: Event) -> None:
        """An event of the request's run, as it comes."""
        if isinstance(event, StartEvent):
            self.metrics.know(event.depths)
        if isinstance(event, RoundEvent):
            self.metrics.round(event)
            self.times += [time.monotonic()] * len(event.commits)

    def end(self, reason: str) -> None:
        """The request ended (``reason``, one of ``REASONS``); counted once."""
        if self.done:
            return
        self.done, metrics = True, self.metrics
        metrics.requests.labels(reason).inc()
        metrics.prompt.inc(self.prompt)
        if self.times:
            metrics.first.observe(self.times[0] - self.arrived)
            for before, after in zip(self.times, self.times[1:]):
                metrics.gap.observe(after - before)
        metrics.whole.observe(time.monotonic() - self.arrived)
