"""/metrics in Prometheus' text format, under vLLM's names where vLLM has the metric.

Each server has its own CollectorRegistry (no process-global one). Gauges are read from the core
loop's latest snapshot when scraped; latencies are observed on the asyncio side, in wall seconds,
from the request's arrival at the HTTP handler to each delivery of tokens.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from harness.serve.core import ServeCore

_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                 20.0, 40.0, 80.0, 160.0)
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
                0.4, 0.5, 0.75, 1.0, 2.5)
_LAG_BUCKETS = (0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 1.0)
_E2E_BUCKETS = (0.1, 0.3, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0)


class ServerMetrics:
    def __init__(self, core: ServeCore, model_name: str) -> None:
        self.registry = registry = CollectorRegistry()
        self.core = core
        labels = ["model_name"]
        self.model = model_name

        def gauge(name: str, doc: str, read) -> None:
            g = Gauge(name, doc, labels, registry=registry)
            g.labels(model_name).set_function(read)

        gauge("vllm:num_requests_running", "Requests in the running batch.", lambda: core.snapshot.running)
        gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled (queued or preempted).",
              lambda: core.snapshot.waiting)
        gauge("vllm:kv_cache_usage_perc", "Fraction of KV-cache blocks in use (1 = full).",
              lambda: core.snapshot.kv_usage)
        gauge("harness:kv_cache_used_blocks", "KV-cache blocks held by requests.", lambda: core.snapshot.used_blocks)
        gauge("harness:num_requests_live", "Requests the server holds (submitted, not finished or aborted).",
              lambda: core.snapshot.live)
        self.prefix_queries = Counter("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
                                      labels, registry=registry).labels(model_name)
        self.prefix_hits = Counter("vllm:prefix_cache_hits", "Prompt tokens served from the prefix cache.",
                                   labels, registry=registry).labels(model_name)
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Prompt tokens of finished requests.", labels,
                                     registry=registry).labels(model_name)
        self.generation_tokens = Counter("vllm:generation_tokens", "Tokens generated.", labels,
                                         registry=registry).labels(model_name)
        self.success = Counter("vllm:request_success", "Finished requests by finish reason.",
                               labels + ["finished_reason"], registry=registry)
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Arrival at the server to the first token.",
                              labels, buckets=_TTFT_BUCKETS, registry=registry).labels(model_name)
        self.itl = Histogram("vllm:inter_token_latency_seconds", "Time between two tokens of a request.",
                             labels, buckets=_ITL_BUCKETS, registry=registry).labels(model_name)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "Arrival to the last token.", labels,
                             buckets=_E2E_BUCKETS, registry=registry).labels(model_name)
        self.lag = Histogram("harness:token_release_lag_seconds",
                             "How late tokens reach the HTTP side after their scheduled time (the simulator's "
                             "simulated time mapped to the wall; the engine's step end).", labels,
                             buckets=_LAG_BUCKETS, registry=registry).labels(model_name)

    def finished(self, prompt_tokens: int, cached_tokens: int, output_tokens: int, reason: str, e2e_s: float) -> None:
        self.prefix_queries.inc(prompt_tokens)
        self.prefix_hits.inc(cached_tokens)
        self.prompt_tokens.inc(prompt_tokens)
        self.success.labels(self.model, reason).inc()
        self.e2e.observe(e2e_s)

    def render(self) -> bytes:
        return generate_latest(self.registry)
