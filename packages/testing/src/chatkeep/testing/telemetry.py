"""OpenTelemetry read back in memory, for tests of what chatkeep's spans and metrics carry.

It installs OpenTelemetry SDK providers (``pip install "chatkeep-testing[telemetry]"``) as the process's
global ones on first use; they sample only inside :func:`recording`, so the other tests of the process run with
tracing off. Nothing here imports pytest.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import Counter, Histogram, MeterProvider
from opentelemetry.sdk.metrics.export import AggregationTemporality, InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON, Sampler, SamplingResult

__all__ = ["Telemetry", "recording"]

_EXPORTER = InMemorySpanExporter()
_READER = InMemoryMetricReader(
    preferred_temporality={Histogram: AggregationTemporality.DELTA, Counter: AggregationTemporality.DELTA}
)


class _WhileRecording(Sampler):
    """Samples inside :func:`recording` only."""

    on = False

    def should_sample(self, *args: Any, **kwargs: Any) -> SamplingResult:
        return (ALWAYS_ON if self.on else ALWAYS_OFF).should_sample(*args, **kwargs)

    def get_description(self) -> str:
        return "on while chatkeep's tests record telemetry"


_SAMPLER = _WhileRecording()


def _install_sdk() -> None:
    # The global providers can be set once per process; chatkeep's tracer and meter (proxies) follow them.
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        provider = TracerProvider(sampler=_SAMPLER)
        provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
        trace.set_tracer_provider(provider)
        metrics.set_meter_provider(MeterProvider(metric_readers=[_READER]))


class Telemetry:
    """What the SDK exported during one test."""

    def spans(self) -> list[ReadableSpan]:
        return list(_EXPORTER.get_finished_spans())

    def span(self, name: str) -> ReadableSpan:
        [found] = [span for span in self.spans() if span.name == name]
        return found

    def points(self, metric: str) -> list[Any]:
        """The data points of ``metric`` recorded since the last call."""
        data = _READER.get_metrics_data()
        found = []
        for resource in data.resource_metrics if data else []:
            for scope in resource.scope_metrics:
                found += [p for m in scope.metrics if m.name == metric for p in m.data.data_points]
        return found

    def children(self, parent: ReadableSpan) -> list[str]:
        """The names of ``parent``'s child spans, in the order they ended."""
        return [span.name for span in self.spans() if span.parent and span.parent.span_id == parent.context.span_id]

    def exported_text(self) -> str:
        """Everything exported, as the JSON an exporter would send (spans, events, metrics)."""
        data = _READER.get_metrics_data()
        return "\n".join([span.to_json() for span in self.spans()] + [data.to_json() if data else ""])


@contextmanager
def recording() -> Iterator[Telemetry]:
    """Sample every span and record every metric while the ``with`` block runs; what it exported, read back."""
    _install_sdk()
    _EXPORTER.clear()
    _READER.get_metrics_data()  # start the block's delta from here
    _SAMPLER.on = True
    try:
        yield Telemetry()
    finally:
        _SAMPLER.on = False
        _EXPORTER.clear()
