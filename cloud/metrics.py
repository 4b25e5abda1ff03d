"""Prometheus metrics of one cloud service, in a registry of its own (two services in one
process do not mix their counts)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

__all__ = ["Metrics", "CONTENT_TYPE_LATEST"]

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter("splitinfer_requests", "Inference requests received", ["plan", "candidate"], registry=r)
        self.errors = Counter("splitinfer_errors", "Error frames sent, by code", ["code"], registry=r)
        self.latency = Histogram("splitinfer_request_seconds", "Request frame received -> result sent",
                                 ["plan", "candidate"], buckets=_LATENCY_BUCKETS, registry=r)
        self.queue = Histogram("splitinfer_queue_seconds", "Time waiting for a batch", buckets=_LATENCY_BUCKETS,
                               registry=r)
        self.compute = Histogram("splitinfer_compute_seconds", "Cloud segment run time per batch",
                                 buckets=_LATENCY_BUCKETS, registry=r)
        self.batch_size = Histogram("splitinfer_batch_size", "Requests per batch",
                                    buckets=(1, 2, 4, 8, 16, 32, 64, 128), registry=r)
        self.queue_depth = Gauge("splitinfer_queue_depth", "Requests waiting", ["plan", "candidate"], registry=r)
        self.sessions = Gauge("splitinfer_sessions_loaded", "onnxruntime sessions loaded", registry=r)
        self.connections = Gauge("splitinfer_connections", "Edge connections open", ["transport"], registry=r)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
