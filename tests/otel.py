"""Tracer providers for the tracing tests (the OpenTelemetry SDK is a test requirement), named by
`JOBQUEUE["TRACING"]`: `provider` keeps the test process's spans in memory; `to_file` is what a
worker subprocess uses when `JOBQUEUE_TEST_SPANS` names a file (tests/settings.py): each span,
once it ends, becomes a line of JSON there for the test to read back."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

memory = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(memory))


def to_file() -> TracerProvider:
    """A provider whose spans are written to the file JOBQUEUE_TEST_SPANS names, as they end."""
    out = open(os.environ["JOBQUEUE_TEST_SPANS"], "a", buffering=1)  # noqa: SIM115 - the process's
    exporter = ConsoleSpanExporter(out=out, formatter=lambda span: span.to_json(indent=None) + "\n")
    written = TracerProvider()
    written.add_span_processor(SimpleSpanProcessor(exporter))
    return written


def read(path: Path) -> list[dict[str, Any]]:
    """The spans `to_file` wrote, as `ReadableSpan.to_json` gives them."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def ids(span: ReadableSpan) -> tuple[str, str]:
    """A span's (trace id, span id) as `to_json` writes them."""
    context = span.get_span_context()
    assert context is not None
    return f"0x{context.trace_id:032x}", f"0x{context.span_id:016x}"
