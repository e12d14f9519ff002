"""OpenTelemetry spans for jobs (the optional extra `jobqueue[otel]`): a producer span per
enqueue, a consumer span per attempt, and the trace context carried in the job between them.

Nothing here imports OpenTelemetry before `tracer()` is first asked (by the first enqueue, or by
a worker starting its runners); it decides once per configuration (`JOBQUEUE["TRACING"]`)
whether there is anything to trace. When OpenTelemetry is not installed, or no tracer provider
is configured, it answers None and jobs go the way they go without this module: a handler's
`enqueue` keeps its short way (`dispatch.Route.ready`), and no payload gains a key.

The context travels in the payload under `"trace"`: the propagator's fields (W3C `traceparent`,
and `tracestate` when there is one), the job's lane (a worker's lease does not hold it), and
`"link": true` for a job of a bulk enqueue, whose attempts link to the batch's producer span
instead of being its children (OpenTelemetry's messaging conventions for batches).

A consumer span starts when a runner takes the job, is current while the handler runs (the
handler's own spans are its children), and ends once the outcome is recorded
(`signals.job_finished`), which is when `jobqueue.outcome` is known, or once a stopping worker
gives the job back unfinished (`released`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextvars import ContextVar, Token
from typing import TYPE_CHECKING, Any, Protocol

from . import signals
from .conf import Config, get_config
from .exceptions import ConfigurationError
from .records import Lease
from .states import State

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer, TracerProvider

    from .spec import JobSpec

KEY = "trace"
"""The payload key that carries a job's trace context."""
SYSTEM = "jobqueue"
OUTCOMES: dict[str, str] = {State.SUCCEEDED: "succeeded", State.PENDING: "retry", State.SCHEDULED: "retry",
            State.DEAD: "dead", State.CANCELLED: "cancelled"}
"""`jobqueue.outcome` by the state an attempt left its job in (else the state itself: `stale`
when the lease had been lost)."""

_decided: tuple[Config, Tracer | None] | None = None


def tracer() -> Tracer | None:
    """jobqueue's tracer, or None when there is nothing to trace (decided at the first call for
    each configuration)."""
    global _decided
    config = get_config()
    decided = _decided
    if decided is None or decided[0] is not config:
        decided = _decided = (config, _tracer(config.tracing))
    return decided[1]


def _tracer(setting: bool | str) -> Tracer | None:
    if setting is False:
        return None
    try:
        from opentelemetry import trace
    except ImportError:  # (a provider's path needs it: settings say so when it is missing)
        return None
    if isinstance(setting, str):
        return _provider(setting).get_tracer(SYSTEM)
    provider = trace.get_tracer_provider()
    # The API's default until an SDK is set up makes spans that record nothing: skip them all.
    if isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider)):
        return None
    return provider.get_tracer(SYSTEM)


def _provider(path: str) -> TracerProvider:
    """The tracer provider `JOBQUEUE["TRACING"]` names, or the one a function there returns."""
    from django.utils.module_loading import import_string

    try:
        found = import_string(path)
    except ImportError as exc:
        raise ConfigurationError(f"JOBQUEUE['TRACING']: cannot import {path!r}: {exc}") from None
    provider = found if hasattr(found, "get_tracer") else found() if callable(found) else None
    if not hasattr(provider, "get_tracer"):
        raise ConfigurationError(f"JOBQUEUE['TRACING']: {path!r} is not a tracer provider nor a "
                                 f"function that returns one")
    return provider  # type: ignore[return-value]


def _messaging(queue: str, operation: str, kind: str) -> dict[str, Any]:
    """The attributes OpenTelemetry's messaging conventions give every span of a queue."""
    return {"messaging.system": SYSTEM, "messaging.destination.name": queue,
            "messaging.operation.type": kind, "messaging.operation.name": operation}


# -- the producer ------------------------------------------------------------------------------


class _Sent(Protocol):
    """What a send answers per job (a `JobRef`): its id, for the span of a single job."""

    @property
    def id(self) -> str: ...


def publish[Sent: _Sent](tracer: Tracer, queue: str, specs: list[JobSpec],
                         send: Callable[[list[JobSpec]], list[Sent]]) -> list[Sent]:
    """`send` the jobs inside one producer span, "publish <queue>", each job carrying its context
    (a batch's jobs carry it as a link)."""
    from opentelemetry.trace import SpanKind

    many = len(specs) > 1
    attributes = _messaging(queue, "publish", "send")
    if many:
        attributes["messaging.batch.message_count"] = len(specs)
    with tracer.start_as_current_span(f"publish {queue}", kind=SpanKind.PRODUCER,
                                      attributes=attributes) as span:
        refs = send(_carrying(specs, many))
        if len(refs) == 1:
            span.set_attribute("messaging.message.id", refs[0].id)
        return refs


def _carrying(specs: list[JobSpec], many: bool) -> list[JobSpec]:
    """The specs with the current context in their payloads. A context that is valid but not
    sampled travels too, so that the worker keeps the producer's sampling decision."""
    from opentelemetry import propagate

    carried: dict[str, Any] = {}
    propagate.inject(carried)
    if not carried:  # no span context to continue
        return specs
    if many:
        carried["link"] = True
    return [spec._replace(payload={**spec.payload, KEY: carried if spec.lane is None
                                   else {**carried, "lane": spec.lane}})
            if isinstance(spec.payload, dict) else spec for spec in specs]


# -- the consumer ------------------------------------------------------------------------------


class Ran(Protocol):
    """What a run comes to (the worker's `Outcome`)."""

    @property
    def ok(self) -> bool: ...
    @property
    def error(self) -> str: ...


class _Attempt:
    """A consumer span, from its runner taking the job until its outcome is recorded."""

    __slots__ = ("error", "raised", "span")

    def __init__(self, span: Span) -> None:
        self.span = span
        self.error = ""
        """The failure's last line (the span's status description)."""
        self.raised = False
        """Whether the exception the handler raised is recorded on the span."""

    def ran[R: Ran](self, outcome: R) -> R:
        """Note a failure on the span: the handler's exception is there already unless it ran
        in another process (or never ran: an unknown handler, a corrupt payload)."""
        if not outcome.ok:
            self.error = (outcome.error.strip().splitlines() or [""])[-1]
            if not self.raised:
                self.span.add_event("exception", {"exception.message": self.error,
                                                  "exception.stacktrace": outcome.error})
        return outcome


_open: dict[tuple[str, int], _Attempt] = {}
"""Attempts whose outcome is not recorded yet, by (job id, token)."""
_current: ContextVar[_Attempt | None] = ContextVar("jobqueue_attempt", default=None)


def worker_tracer() -> Tracer | None:
    """`tracer()`, for a worker's runners: when it is one, each attempt's span ends once its
    outcome is recorded."""
    found = tracer()
    if found is not None:
        signals.job_finished.connect(_finished, dispatch_uid=__name__)
    return found


def run[R: Ran](tracer: Tracer, lease: Lease, job: Callable[[], R]) -> R:
    """Run a claimed job inside its attempt's span."""
    attempt, tokens = _enter(tracer, lease)
    try:
        outcome = job()
    finally:
        _leave(tokens)
    return attempt.ran(outcome)


async def run_async[R: Ran](tracer: Tracer, lease: Lease, job: Callable[[], Awaitable[R]]) -> R:
    """`run` for a job on the worker's event loop."""
    attempt, tokens = _enter(tracer, lease)
    try:
        outcome = await job()
    finally:
        _leave(tokens)
    return attempt.ran(outcome)


def failed(exc: BaseException) -> None:
    """Record what a handler raised on its attempt's span (when one is current here: a handler
    run in a process pool has none, and its span gets the error's text instead)."""
    attempt = _current.get()
    if attempt is not None:
        kind = type(exc)
        name = kind.__qualname__
        attempt.span.record_exception(exc)
        attempt.span.set_attribute("error.type", name if kind.__module__ == "builtins"
                                   else f"{kind.__module__}.{name}")
        attempt.raised = True


def _enter(tracer: Tracer, lease: Lease) -> tuple[_Attempt, tuple[object, Token[_Attempt | None]]]:
    from opentelemetry import context, trace

    attempt = _open[lease.job_id, lease.token] = _Attempt(_start(tracer, lease))
    return attempt, (context.attach(trace.set_span_in_context(attempt.span)), _current.set(attempt))


def _leave(tokens: tuple[object, Token[_Attempt | None]]) -> None:
    from opentelemetry import context

    _current.reset(tokens[1])
    context.detach(tokens[0])  # type: ignore[arg-type]


def _start(tracer: Tracer, lease: Lease) -> Span:
    """The attempt's span: a child of the producer's, or for a batch's job a root linking to it."""
    from opentelemetry import context, propagate, trace

    payload: dict[str, Any] = lease.payload if isinstance(lease.payload, dict) else {}
    found = payload.get(KEY)
    carried: dict[str, Any] = found if isinstance(found, dict) else {}
    parent = propagate.extract({k: v for k, v in carried.items() if isinstance(v, str)})
    links = []
    if carried.get("link") is True:
        producer = trace.get_current_span(parent).get_span_context()
        links = [trace.Link(producer)] if producer.is_valid else []
        parent = context.Context()
    attributes = {**_messaging(lease.queue, "process", "process"),
                  "messaging.message.id": lease.job_id,
                  "messaging.destination.partition.id": str(lease.shard),
                  "jobqueue.attempt": lease.token}
    if isinstance(payload.get("handler"), str):
        attributes["jobqueue.handler"] = payload["handler"]
    if carried:  # (the lane is known only when the producer traced the job)
        lane = carried.get("lane")
        attributes["jobqueue.lane"] = lane if isinstance(lane, str) else ""
    return tracer.start_span(f"process {lease.queue}", context=parent, links=links,
                             kind=trace.SpanKind.CONSUMER, attributes=attributes)


def _finished(sender: object, lease: Lease, state: str, **_: object) -> None:
    """End an attempt's span once its outcome is recorded (a `job_finished` receiver)."""
    _end(lease, OUTCOMES.get(state, state))


def released(lease: Lease, ok: bool = True) -> None:
    """End the span of an attempt the worker gave back unfinished (it stops): outcome
    `released`, or `stale` when the lease had been lost. Nothing when it had no span (a
    prefetched job never started, or tracing is off)."""
    if _open:
        _end(lease, "released" if ok else "stale")


def _end(lease: Lease, outcome: str) -> None:
    from opentelemetry.trace import StatusCode

    attempt = _open.pop((lease.job_id, lease.token), None)
    if attempt is None:  # (started before tracing was on, or never started)
        return
    attempt.span.set_attribute("jobqueue.outcome", outcome)
    if outcome in ("retry", "dead"):
        attempt.span.set_status(StatusCode.ERROR, attempt.error)
    attempt.span.end()
