"""The server's Prometheus metrics, in a registry of its own (one per server)."""

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from engine.server.scheduler import Scheduler

_LATENCY_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class ServerMetrics:
    """Counters of requests and tokens, time to first token, speed, queue length and wait."""

    def __init__(self, scheduler_of):
        """`scheduler_of()` gives the current Scheduler, or None while no model is loaded."""
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "sprig_requests", "Generation requests by endpoint and outcome", ["endpoint", "outcome"], registry=r
        )
        self.prompt_tokens = Counter("sprig_prompt_tokens", "Prompt tokens of served requests", registry=r)
        self.cached_tokens = Counter("sprig_prompt_tokens_cached", "Prompt tokens reused from the KV cache", registry=r)
        self.generated_tokens = Counter("sprig_generated_tokens", "Tokens generated", registry=r)
        self.ttft = Histogram(
            "sprig_time_to_first_token_seconds",
            "From the model's turn to the first token",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_wait = Histogram(
            "sprig_queue_wait_seconds", "Time a request waited for the model", buckets=_LATENCY_BUCKETS, registry=r
        )
        self.tokens_per_second = Gauge("sprig_decode_tokens_per_second", "Decode speed of the last request", registry=r)
        self.queue_length = Gauge("sprig_queue_length", "Requests waiting for the model", registry=r)
        self.in_flight = Gauge("sprig_requests_in_flight", "Requests running (decoded together)", registry=r)

        def current(attribute: str):
            def read() -> float:
                scheduler: Scheduler | None = scheduler_of()
                return float(getattr(scheduler, attribute)) if scheduler is not None else 0.0

            return read

        self.queue_length.set_function(current("waiting"))
        self.in_flight.set_function(current("in_flight"))

    def text(self) -> bytes:
        """The metrics in Prometheus' text format."""
        return generate_latest(self.registry)
