"""The producer API: `@job`, `enqueue` by dotted path, `get_job` (how an enqueue then goes:
dispatch.py).

A job's payload is `{"handler": "<dotted name>", "args": [...], "kwargs": {...}}` (and "trace"
when the enqueue is traced: tracing.py). Handlers are registered when their module is imported;
the worker imports every installed app's `jobs`.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, NamedTuple, overload

from .. import ids, tracing
from ..conf import get_client, get_config
from ..engine.refs import JobRef
from ..engine.store import Queue, Template
from ..exceptions import InvalidFlow, InvalidOption, UnknownHandler
from ..flows import graph
from ..keys import validate_queue
from ..options import validate_timeout
from ..records import JobInfo, Lease
from ..spec import JobSpec, encode_payload, prepare
from .batches import DEFAULT_BATCH_WAIT, check_options
from .dispatch import Route, submit, submit_flow

_registry: dict[str, JobFunction] = {}
Call = Sequence[Any] | Mapping[str, Any] | tuple[Sequence[Any], Mapping[str, Any]]
"""One call of a handler: a tuple of args, a dict of kwargs, or (args, kwargs)."""

SPEC_OPTIONS = ("lane", "priority", "delay", "run_after", "max_attempts", "backoff", "lease",
                "unique_key", "job_id", "debounce", "expires", "timeout", "encrypt")


@dataclass(frozen=True)
class JobOptions:
    """A handler's defaults plus per-call overrides from `.using(...)`."""

    queue: str = "default"
    takes_context: bool = False
    immediate: bool = False
    """Enqueue at once even inside `transaction.atomic()` (default: on commit)."""
    spec: Mapping[str, Any] = field(default_factory=dict)
    after: tuple[str, ...] = ()
    """Ids of the jobs it waits for (`depends_on`): it runs once they are done."""
    after_queues: tuple[tuple[str, str], ...] = ()
    """(id, queue) of those `depends_on` named by a ref of another queue than `queue`."""
    on_failure: str | None = None
    """What a failed dependency does to it (`graph.POLICIES`); None: "fail"."""
    batch: int | None = None
    """A batch handler's most jobs per call (batches.py); None: one job per call."""
    batch_wait: float = DEFAULT_BATCH_WAIT
    """Seconds a batch waits for more jobs after its first."""


class JobFunction:
    """A registered handler: call it to run inline, `.enqueue(...)` to run it on a worker."""

    def __init__(self, func: Callable[..., Any], name: str, options: JobOptions) -> None:
        self.func = func
        self.name = name
        self.options = options
        self.is_async = inspect.iscoroutinefunction(func)
        """An `async def` handler: its jobs run on the worker's event loop."""
        self.__doc__ = func.__doc__
        self.__wrapped__ = func
        self._route: Route | None = None

    def __repr__(self) -> str:
        return f"<job {self.name} queue={self.options.queue!r}>"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.func(*args, **kwargs)

    def using(self, *, queue: str | None = None, immediate: bool | None = None,
              depends_on: Iterable[JobRef | str] | None = None, on_failure: str | None = None,
              **spec: Any) -> JobFunction:
        """A copy with per-call options (lane, priority, delay, run_after, max_attempts,
        unique_key, debounce, expires, …); `depends_on` (refs, of any queue, or ids of jobs of
        its own queue) makes its jobs wait for those, `on_failure` says what a failed one does
        to them ("fail", "ignore", "continue")."""
        _check_spec_options(spec)
        after = None if depends_on is None else _refs(depends_on)
        options = replace(
            self.options,
            queue=self.options.queue if queue is None else validate_queue(queue),
            immediate=self.options.immediate if immediate is None else immediate,
            spec={**self.options.spec, **spec},
            after=self.options.after if after is None else tuple(job_id for job_id, _ in after),
            after_queues=self.options.after_queues if after is None
            else tuple((job_id, name) for job_id, name in after if name),
            on_failure=self.options.on_failure if on_failure is None else graph.policy(on_failure),
        )
        return JobFunction(self.func, self.name, options)

    def s(self, *args: Any, **kwargs: Any) -> Signature:
        """A signature: this handler with these arguments, to build a flow from
        (`jobqueue.chain`, `group`, `chord`) or to enqueue later."""
        return Signature(self, args, kwargs)

    def enqueue(self, *args: Any, **kwargs: Any) -> JobRef:
        payload = _payload(self.name, args, kwargs)
        if self.options.after:
            return self._enqueue_after([payload])[0]
        route = self._routed()
        if (ready := route.template()) is not None:
            if ready.sealed:
                return ready.enqueue_sealed(payload, route.config.max_payload)
            return ready.enqueue(ids.new_id(), encode_payload(payload, route.config.max_payload))
        return submit(route.queue, [JobSpec(payload, **self.options.spec)], self.options.immediate)[0]

    def _enqueue_after(self, payloads: list[dict[str, Any]]) -> list[JobRef]:
        """Jobs waiting for `options.after` (one script call on their shard: graph.py)."""
        policy = self.options.on_failure or "f"
        members = tuple((member, slot, policy) for slot, member in enumerate(self.options.after))
        nodes = [graph.Node(JobSpec(payload, **self.options.spec)._replace(
            job_id=self.options.spec.get("job_id") or ids.new_id()), members,
            queue=self.options.queue, away=self.options.after_queues) for payload in payloads]
        return submit_flow(Queue(self.options.queue), nodes, "", self.options.immediate)

    def enqueue_many(self, calls: Iterable[Call]) -> list[JobRef]:
        """Enqueue one job per call: a tuple of args, a dict of kwargs, or (args, kwargs)."""
        if self.options.after:
            return self._enqueue_after([_payload(self.name, *_split(call)) for call in calls])
        route = self._routed()
        if (ready := route.template()) is not None and not ready.sealed:
            # The handler's template, validated once: each job only mints its id and encodes
            # its payload (as `enqueue` does).
            limit = route.config.max_payload
            return route.queue.enqueue_prepared([
                ready.job._replace(job_id=ids.new_id(),
                               payload=encode_payload(_payload(self.name, *_split(call)), limit))
                for call in calls])
        specs = [JobSpec(_payload(self.name, *_split(call)), **self.options.spec) for call in calls]
        return submit(route.queue, specs, self.options.immediate)

    def _routed(self) -> Route:
        """This handler's route for the current configuration (settings changed in a test make
        a new one): its queue, and its options validated once rather than at every enqueue (an
        enqueue's Python is most of its time on an idle machine, where caches are cold)."""
        config, route = get_config(), self._route
        if route is None or route.config is not config:
            # Its client too: a new one comes with a new config (`conf.reset`). The embedded
            # server's is looked up each time (a lookup that restarts the server if it died).
            queue = Queue(self.options.queue,
                          client=None if config.url == "embedded" else get_client())
            spec = JobSpec({}, **self.options.spec)
            simple = not (queue.options.durable or spec.job_id is not None or spec.run_after is not None
                          or isinstance(spec.expires, datetime)  # (an instant: its ms vary)
                          or tracing.tracer() is not None)
            ready = (Template(queue, prepare(spec, queue.options),
                              sealed=bool(queue.options.encrypt or spec.encrypt))
                     if simple else None)
            route = self._route = Route(config, queue, ready,
                                         self.options.immediate or not config.on_commit)
        return route


@dataclass(frozen=True)
class Signature:
    """A handler with its arguments, not yet enqueued (`handler.s(...)`)."""

    handler: JobFunction
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)

    def using(self, **options: Any) -> Signature:
        """The same call with enqueue options (`JobFunction.using`'s)."""
        return replace(self, handler=self.handler.using(**options))

    def enqueue(self) -> JobRef:
        return self.handler.enqueue(*self.args, **self.kwargs)

    def payload(self) -> dict[str, Any]:
        """The job's payload (the handler's name and arguments)."""
        return _payload(self.handler.name, self.args, self.kwargs)

    def registered(self) -> bool:
        """Whether its handler runs on a worker: an `@job` of this name (a bridged task's
        signature answers for its bridge)."""
        return _registry.get(self.handler.name) is not None

    def node(self, members: tuple[tuple[str, int, str], ...] = (), takes: str = "",
             policy: str | None = None) -> graph.Node:
        """This call as a job of a flow (a fresh id unless it names one), waiting for
        `members` (id, slot, policy code); `policy`: the flow's, for those the call leaves
        open. Refused when no `@job` is registered under its name, or it cannot take what its
        members' outcomes become (`takes`)."""
        handler = self.handler
        if not self.registered():
            raise UnknownHandler(f"no @job handler registered as {handler.name!r}")
        if takes:
            _check_takes(handler, self.args, self.kwargs)
        spec = JobSpec(self.payload(), **handler.options.spec)
        own = handler.options.on_failure or policy or "f"
        # Its `depends_on` jobs only hold it back (as they do a job enqueued alone): their
        # slots come after the members' and are not passed to it.
        after = tuple((member, slot + len(members), own)
                      for slot, member in enumerate(handler.options.after))
        return graph.Node(spec._replace(job_id=spec.job_id or ids.new_id()), (*members, *after),
                          takes, len(members) if takes == "list" else int(bool(takes)),
                          queue=handler.options.queue, away=handler.options.after_queues)


def _check_takes(handler: JobFunction, args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
    """A flow's step gets what came before as its first argument: its handler must take one
    (a batch handler takes its items, whatever their arguments)."""
    if handler.options.batch:
        return
    context = (None,) if handler.options.takes_context else ()
    try:
        inspect.signature(handler.func).bind(*context, None, *args, **kwargs)
    except TypeError as exc:
        raise InvalidFlow(f"{handler.name} cannot take the previous result as its first "
                          f"argument: {exc}") from None


def _refs(refs: Iterable[JobRef | str]) -> list[tuple[str, str]]:
    """The jobs `depends_on` names (refs or ids), checked: (id, its queue; '' for an id
    alone, a job of the dependent's own queue)."""
    if isinstance(refs, (str, JobRef)):
        refs = [refs]
    return [(ids.validate_job_id(ref.id), ref.queue) if isinstance(ref, JobRef)
            else (ids.validate_job_id(ref), "") for ref in refs]


def _split(call: Any) -> tuple[Sequence[Any], Mapping[str, Any]]:
    if isinstance(call, Mapping):
        return (), call
    if (isinstance(call, tuple) and len(call) == 2 and isinstance(call[0], (tuple, list))
            and isinstance(call[1], Mapping)):
        return call[0], call[1]
    if isinstance(call, (tuple, list)):
        return call, {}
    raise InvalidOption(f"each call must be a tuple of args, a dict of kwargs or (args, kwargs): {call!r}")


def _payload(handler: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """Empty args and kwargs are left out: every waiting job's bytes are Valkey RAM."""
    payload: dict[str, Any] = {"handler": handler}
    if args:
        payload["args"] = list(args)
    if kwargs:
        payload["kwargs"] = dict(kwargs)
    return payload


def _check_spec_options(spec: Mapping[str, Any]) -> None:
    unknown = set(spec) - set(SPEC_OPTIONS)
    if unknown:
        raise InvalidOption(f"unknown option(s) {sorted(unknown)}; allowed: {list(SPEC_OPTIONS)}")
    if spec.get("encrypt") not in (None, True, False):
        raise InvalidOption(f"encrypt must be True or False, got {spec['encrypt']!r}")


@overload
def job(func: Callable[..., Any], /) -> JobFunction: ...
@overload
def job(*, queue: str = ..., priority: int = ..., max_attempts: int = ..., backoff: float = ...,
        lease: float = ..., timeout: float = ..., encrypt: bool = ..., takes_context: bool = ...,
        name: str | None = ..., immediate: bool = ..., batch: int | None = ...,
        batch_wait: float | None = ...) -> Callable[[Callable[..., Any]], JobFunction]: ...


def job(func: Callable[..., Any] | None = None, /, *, queue: str = "default",
        name: str | None = None, takes_context: bool = False, immediate: bool = False,
        batch: int | None = None, batch_wait: float | None = None, **spec: Any) -> Any:
    """Register a handler, bare (`@job`) or with defaults (`@job(queue="emails", priority=5)`);
    `batch=n`: it takes lists of up to n jobs (`BatchItem`), gathered for `batch_wait` s."""
    _check_spec_options(spec)
    most, wait = check_options(name or "@job", batch, batch_wait)
    validate_queue(queue)  # now, at import, not at the first enqueue
    if spec.get("timeout") is not None:
        validate_timeout(spec["timeout"])

    def register(f: Callable[..., Any]) -> JobFunction:
        dotted = name or f"{f.__module__}.{f.__qualname__}"
        if takes_context and next(iter(inspect.signature(f).parameters), None) != "ctx":
            raise InvalidOption(f"{dotted}: takes_context=True needs a first parameter named ctx")
        if most is not None:
            _check_batch_call(dotted, f, takes_context)
        handler = JobFunction(f, dotted, JobOptions(queue, takes_context, immediate, spec,
                                                    batch=most, batch_wait=wait))
        _registry[dotted] = handler
        return handler

    return register(func) if func is not None else register


def _check_batch_call(name: str, func: Callable[..., Any], takes_context: bool) -> None:
    """A batch handler is called with its items' list (after `ctx`): InvalidOption, naming
    it, when its parameters cannot take that call (its every job would fail at its run)."""
    try:
        inspect.signature(func).bind(*((None,) if takes_context else ()), [])
    except TypeError as exc:
        raise InvalidOption(
            f"{name}: a batch handler is called as {'f(ctx, items)' if takes_context else 'f(items)'} "
            f"(items: a list of BatchItem), which it cannot take: {exc}"
        ) from None


def registered_batch(name: str) -> JobFunction | None:
    """The `@job` batch handler registered as `name` (None: none, or not a batch handler)."""
    found = _registry.get(name)
    return found if found is not None and found.options.batch else None


def largest_batch(queues: Iterable[str] | None = None) -> int:
    """The largest `batch` of the handlers registered on these queues (None: on any queue); 0
    when none is a batch handler."""
    names = None if queues is None else set(queues)
    return max((found.options.batch or 0 for found in _registry.values()
                if names is None or found.options.queue in names), default=0)


def lookup(name: str) -> JobFunction:
    """The registered handler for a dotted name; UnknownHandler names what is missing."""
    try:
        return _registry[name]
    except KeyError:
        raise UnknownHandler(f"no @job handler registered as {name[:200]!r}") from None


def registered() -> list[str]:
    """The dotted names of the `@job` handlers this process has imported, sorted."""
    return sorted(_registry)


class Bridge(NamedTuple):
    """How jobs enqueued through another task API find their task."""

    module: str
    """The module whose `handler_for` turns such a handler name into a handler (imported on
    first use: a worker without Celery never imports it)."""
    needs: str | None = None
    """A module the project must have imported itself for the bridge to be on."""


BRIDGES = {"django.tasks:": Bridge("jobqueue.tasks"),
           "celery:": Bridge("jobqueue.contrib.celery", needs="celery")}
"""Payload handler prefixes of jobs enqueued through a bridge. A bridge resolves only tasks the
process defined itself: a job's handler name never makes a process import a module."""


def handler_for(name: str, lease: Lease) -> JobFunction:
    """The handler a payload names: an `@job` by dotted name, or a bridged task by prefix."""
    found = _registry.get(name)  # (the common case first: a dotted name holds no colon)
    if found is not None:
        return found
    for prefix, bridge in BRIDGES.items():
        if name.startswith(prefix):
            return _bridged(bridge, name).handler_for(name, lease)
    return lookup(name)


def _bridged(bridge: Bridge, name: str) -> Any:
    """The bridge's module, when this process uses it; UnknownHandler otherwise."""
    if bridge.needs is not None and sys.modules.get(bridge.needs) is None:
        raise UnknownHandler(f"{name[:200]!r} is a {bridge.needs} task, and this process does not "
                             f"use {bridge.needs}")
    try:
        return importlib.import_module(bridge.module)
    except ImportError as exc:
        raise UnknownHandler(f"{name[:200]!r} cannot run here: {exc}") from None


def enqueue(name: str, args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None, *,
            queue: str | None = None, lane: str | None = None, priority: int | None = None,
            delay: float | timedelta | None = None, run_after: datetime | None = None,
            max_attempts: int | None = None, unique_key: str | None = None,
            immediate: bool = False, **more: Any) -> JobRef:
    """Enqueue a handler by dotted path (it need not be imported in this process)."""
    registered = _registry.get(name)
    base = registered.options if registered else JobOptions()
    spec = {**base.spec, **{k: v for k, v in dict(
        lane=lane, priority=priority, delay=delay, run_after=run_after,
        max_attempts=max_attempts, unique_key=unique_key, **more).items() if v is not None}}
    _check_spec_options(spec)
    if not isinstance(name, str) or not name:
        raise UnknownHandler(f"handler must be a dotted name, got {name!r}")
    payload = _payload(name, list(args), dict(kwargs or {}))
    target = Queue(base.queue if queue is None else queue)  # an explicit "" is refused
    return submit(target, [JobSpec(payload, **spec)], immediate or base.immediate)[0]


def get_job(job_id: str, queue: str = "default") -> JobInfo | None:
    """A job's state: live from Valkey, else from its MySQL mirror row, else None."""
    from ..models import Job
    from ..sealing import opened_info

    live = Queue(queue).get(job_id)
    if live is None:
        row = Job.objects.filter(pk=job_id).first()
        live = row.info() if row is not None else None
    return opened_info(live) if live is not None and live.sealed else live
