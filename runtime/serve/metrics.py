"""Prometheus metrics of one server, in their own registry (two servers in one process,
as in the tests, do not share counters).

Written with `prometheus_client`, the reference implementation of the text format: its
escaping, histogram buckets (`_bucket{le=...}`, `_sum`, `_count`) and content type are what
scrapers expect, and it is pure Python with no dependencies.

| metric | type | what |
|---|---|---|
| `edgeseq_requests_total{endpoint,status}` | counter | HTTP requests answered, by status code |
| `edgeseq_inputs_total` | counter | inputs run by the model (empty inputs are not run) |
| `edgeseq_generated_tokens_total` | counter | tokens of the best hypotheses, `</s>` included |
| `edgeseq_batch_size` | histogram | inputs per engine call (step batching: rows per step) |
| `edgeseq_batch_seconds` | histogram | seconds per engine call (step batching: per step) |
| `edgeseq_queue_depth` | gauge | inputs waiting for a batch |
| `edgeseq_request_seconds{endpoint}` | histogram | request latency, arrival to answer |
| `edgeseq_batching_info{mode}` | info | how greedy requests are batched: `step` or `request` |
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST

CONTENT_TYPE = CONTENT_TYPE_LATEST
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class ServeMetrics:
    """The counters, gauge and histograms of one server."""

    def __init__(self, queue_depth: Callable[[], int], batching: str = "request") -> None:
        """`queue_depth()` returns the inputs waiting; it is read at each scrape. `batching`:
        "step" or "request" (runtime/serve/continuous.py), reported as an info metric."""
        disable_created_metrics()  # no `_created` series: the process start time says as much
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "edgeseq_requests", "HTTP requests answered", ["endpoint", "status"], registry=r
        )
        self.inputs = Counter("edgeseq_inputs", "Inputs run by the model", registry=r)
        self.tokens = Counter(
            "edgeseq_generated_tokens", "Generated tokens (best hypotheses, </s> included)",
            registry=r,
        )  # fmt: skip
        self.batch_size = Histogram(
            "edgeseq_batch_size", "Inputs per engine call", buckets=BATCH_BUCKETS, registry=r
        )
        self.batch_seconds = Histogram(
            "edgeseq_batch_seconds", "Seconds per engine call", buckets=LATENCY_BUCKETS, registry=r
        )
        self.latency = Histogram(
            "edgeseq_request_seconds", "Request latency, arrival to answer", ["endpoint"],
            buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        depth = Gauge("edgeseq_queue_depth", "Inputs waiting for a batch", registry=r)
        depth.set_function(queue_depth)
        mode = Info("edgeseq_batching", "How greedy requests are batched", registry=r)
        mode.info({"mode": batching})

    def on_batch(self, inputs: int, tokens: int, seconds: float) -> None:
        """Record one engine call (the batcher's callback)."""
        self.inputs.inc(inputs)
        self.tokens.inc(tokens)
        self.batch_size.observe(inputs)
        self.batch_seconds.observe(seconds)

    def on_step(self, rows: int, joined: int, tokens: int, seconds: float) -> None:
        """Record one decoder step of step batching: `rows` in the batch, `joined` of them
        new (inputs run), `tokens` chosen (the step batcher's callback)."""
        self.inputs.inc(joined)
        self.tokens.inc(tokens)
        self.batch_size.observe(rows)
        self.batch_seconds.observe(seconds)

    def on_request(self, endpoint: str, status: int, seconds: float) -> None:
        """Record one answered HTTP request."""
        self.requests.labels(endpoint, str(status)).inc()
        self.latency.labels(endpoint).observe(seconds)

    def text(self) -> bytes:
        """The exposition in Prometheus text format."""
        return generate_latest(self.registry)
