"""/metrics in Prometheus' text format, under vLLM's names where vLLM has the metric.

Each server has its own CollectorRegistry (no process-global one). Counts and histograms are plain
numbers updated on the asyncio loop, where every token passes (a bisect and two additions: no lock,
no label lookup), and turned into metric families only when scraped. Gauges are read from the core's
latest snapshot. Latencies are wall seconds from the request's arrival at the HTTP server.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from harness.serve.board import MetricsBoard
from harness.serve.core import ServeCore

_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                 20.0, 40.0, 80.0, 160.0)
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
                0.4, 0.5, 0.75, 1.0, 2.5)
_LAG_BUCKETS = (0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 1.0)
_E2E_BUCKETS = (0.1, 0.3, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0)


class Histogram:
    """Counts per bucket (upper bounds, le) and the sum; only the loop thread observes."""

    def __init__(self, name: str, doc: str, buckets: tuple[float, ...]) -> None:
        self.name, self.doc, self.bounds = name, doc, buckets
        self.counts = [0] * (len(buckets) + 1)  # the last: above every bound (+Inf)
        self.sum = 0.0

    def observe(self, value: float, count: int = 1) -> None:
        self.counts[bisect_left(self.bounds, value)] += count
        self.sum += value * count

    def family(self, labels: list[str], values: list[str], counts: list[float] | None = None,
               total: float | None = None) -> HistogramMetricFamily:
        """The histogram as Prometheus reads it; counts and total: another tally of the same buckets
        (every HTTP process's, summed) in place of this one's."""
        cumulative, running = [], 0.0
        for bound, count in zip((*map(str, self.bounds), "+Inf"), self.counts if counts is None else counts):
            running += count
            cumulative.append((bound, running))
        family = HistogramMetricFamily(self.name, self.doc, labels=labels)
        family.add_metric(values, cumulative, self.sum if total is None else total)
        return family


REASONS = ("length", "stop", "abort")  # finish reasons (generation._OPENAI_REASON's values)
_HISTOGRAM_BUCKETS = (_TTFT_BUCKETS, _ITL_BUCKETS, _E2E_BUCKETS, _LAG_BUCKETS)  # ServerMetrics.histograms'


def row_width() -> int:
    """The length of ServerMetrics.values(): a row of the shared board."""
    return 4 + len(REASONS) + sum(len(buckets) + 2 for buckets in _HISTOGRAM_BUCKETS) + 1


class ServerMetrics:
    """One HTTP process's counts; with a board (serve.api_servers > 1) a scrape sums every process's
    row of it (harness.serve.board)."""

    def __init__(self, core: ServeCore, model_name: str, board: MetricsBoard | None = None, front: int = 0) -> None:
        self.core = core
        self.model = model_name
        self.board, self.front = board, front
        self.prefix_queries = self.prefix_hits = self.prompt_tokens = self.generation_tokens = 0
        self.success: Counter[str] = Counter()
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Arrival at the server to the first token.",
                              _TTFT_BUCKETS)
        self.itl = Histogram("vllm:inter_token_latency_seconds", "Time between two tokens of a request.",
                             _ITL_BUCKETS)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "Arrival to the last token.", _E2E_BUCKETS)
        self.lag = Histogram("harness:token_release_lag_seconds",
                             "How late tokens reach the HTTP side after their scheduled time (the simulator's "
                             "simulated time mapped to the wall; the engine's step end).", _LAG_BUCKETS)
        self.registry = CollectorRegistry()
        self.registry.register(self)

    @property
    def histograms(self) -> tuple[Histogram, ...]:
        return self.ttft, self.itl, self.e2e, self.lag

    def tokens(self, count: int) -> None:
        self.generation_tokens += count

    def finished(self, prompt_tokens: int, cached_tokens: int, output_tokens: int, reason: str, e2e_s: float) -> None:
        self.prefix_queries += prompt_tokens
        self.prefix_hits += cached_tokens
        self.prompt_tokens += prompt_tokens
        self.success[reason] += 1
        self.e2e.observe(e2e_s)
        # a pass publishes once at its end (core.after_pass); a plain request's text, taken after
        # it, finishes the request outside one
        if self.board is not None and not self.core.passing:
            self.publish()

    def values(self) -> list[float]:
        """The counts as one row: the four counters, success per REASONS, each histogram's counts
        and sum, the requests held."""
        row = [self.prefix_queries, self.prefix_hits, self.prompt_tokens, self.generation_tokens,
               *(self.success[reason] for reason in REASONS)]
        for histogram in self.histograms:
            row += histogram.counts
            row.append(histogram.sum)
        row.append(self.core.snapshot.live)  # the requests this process holds
        return row

    def publish(self) -> None:
        """This process's row on the board (after each pass over a step and each finish; none
        without a board)."""
        if self.board is not None:
            self.board.publish(self.front, self.values())

    def collect(self):
        """The registry's view (prometheus_client calls it on each scrape)."""
        labels, values = ["model_name"], [self.model]
        snap = self.core.snapshot
        if self.board is None:
            row = self.values()
        else:
            self.publish()
            row = [float(v) for v in self.board.total()]
        live = int(row[-1])  # held by every HTTP process
        for name, doc, value in (
                ("vllm:num_requests_running", "Requests in the running batch.", snap.running),
                ("vllm:num_requests_waiting", "Requests waiting to be scheduled (queued or preempted).", snap.waiting),
                ("vllm:kv_cache_usage_perc", "Fraction of KV-cache blocks in use (1 = full).", snap.kv_usage),
                ("harness:kv_cache_used_blocks", "KV-cache blocks held by requests.", snap.used_blocks),
                ("harness:num_requests_live", "Requests the server holds (submitted, not finished or aborted).",
                 live)):
            gauge = GaugeMetricFamily(name, doc, labels=labels)
            gauge.add_metric(values, value)
            yield gauge
        for name, doc, value in zip(("vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:prompt_tokens",
                                     "vllm:generation_tokens"), _COUNTER_DOCS, row):
            counter = CounterMetricFamily(name, doc, labels=labels)
            counter.add_metric(values, value)
            yield counter
        success = CounterMetricFamily("vllm:request_success", "Finished requests by finish reason.",
                                      labels=["model_name", "finished_reason"])
        for reason, count in zip(REASONS, row[4:4 + len(REASONS)]):
            if count:
                success.add_metric([self.model, reason], count)
        yield success
        at = 4 + len(REASONS)
        for histogram in self.histograms:
            width = len(histogram.counts)
            yield histogram.family(labels, values, row[at:at + width], row[at + width])
            at += width + 1

    def render(self) -> bytes:
        return generate_latest(self.registry)


_COUNTER_DOCS = ("Prompt tokens looked up in the prefix cache.", "Prompt tokens served from the prefix cache.",
                 "Prompt tokens of finished requests.", "Tokens generated.")
