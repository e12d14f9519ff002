"""Celery's canvas of bridged tasks as one jobqueue flow: `chain`, `group`, `chord`, `link` and
`link_error` of JobTask signatures, compiled (`Canvas`) into jobqueue's own composition
(`api.composition`) when the canvas is applied.

Celery's canvas classes apply themselves through Celery's broker and result backend; `install`
diverts their `apply_async` (which `delay`, `__call__` and a chord's `(callback)` go through) to
`apply` when the canvas holds a bridged task, and leaves every other canvas to Celery. What
Celery means is kept: a chain hands each step the previous result as its first argument, a
chord's callback gets the list of its header's results, a group's result is the list of its
members', an immutable signature (`.si()`) gets nothing handed on, partial arguments are
prepended (`chain(...)(x)`, `group(...)(x)`, `chord(...)(x)`), `link` callbacks get the task's
result and `link_error` errbacks run when it fails (once per failed task, and for a chord's
callback when a header task failed), as jobs of the same flow. What has no honest equivalent
(`chunks`, `xmap`, `xstarmap`, a `link` on a group, a canvas's `task_id`, a canvas mixing
bridged and Celery tasks, …) is refused by name with InvalidOption before anything is written.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from celery import canvas as celery
from celery.exceptions import NotRegistered

from .. import ids
from ..api.composition import Chain, GroupRef, Part, chain, chord, group
from ..api.registry import JobFunction, JobOptions, Signature
from ..engine.refs import JobRef
from ..exceptions import InvalidOption
from ..flows.graph import Node
from .celery_calls import PREFIX, BridgedTask, JobCall, JobGroupResult, JobResult

START_OPTIONS = ("countdown", "eta", "expires")
"""A canvas's options for the jobs that start it (a chain's first step, a group's members, a
chord's header), as Celery sends them with those tasks only; its other options go to each of
its tasks that does not set its own."""
ERRBACK = "errback"
"""The payload's key for an errback job: the task it watches (id, queue), the jobs of the chord
header it may report, and whether the errback is immutable."""


@dataclass(frozen=True)
class TaskSignature(Signature):
    """A bridged Celery task's call as a flow's job: `immutable` (`.si()`) takes nothing from
    the jobs it waits for; `extra` goes into its payload (a soft time limit, an errback's
    watch)."""

    immutable: bool = False
    extra: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(
        cls,
        task: BridgedTask,
        call: JobCall,
        run: Callable[..., Any],
        immutable: bool = False,
        watch: Mapping[str, Any] | None = None,
    ) -> TaskSignature:
        """The signature of `call` (a job of `task`), whose handler checks what it is handed
        (`run`: the task's own body, or what an errback job takes); `watch`: an errback's."""
        payload = call.payload
        own = {key: value for key, value in payload.items() if key not in ("handler", "args", "kwargs")}
        return cls(
            JobFunction(run, PREFIX + task.name, JobOptions(queue=call.queue, spec=call.spec)),
            tuple(payload["args"]),
            payload["kwargs"],
            immutable=immutable,
            extra={**own, ERRBACK: watch} if watch else own,
        )

    def registered(self) -> bool:
        return True  # (the bridge checked its task; the worker finds it in Celery's registry)

    def payload(self) -> dict[str, Any]:
        return {**super().payload(), **self.extra}

    def node(
        self, members: tuple[tuple[str, int, str], ...] = (), takes: str = "", policy: str | None = None
    ) -> Node:
        timed = [
            name
            for name, key in (("countdown", "delay"), ("eta", "run_after"))
            if self.handler.options.spec.get(key) is not None
        ]
        if members and timed:
            raise InvalidOption(
                f"{self.handler.name}: {' and '.join(timed)} on a task that waits "
                "for others in a canvas is refused: it starts when they are done"
            )
        return super().node(members, "" if self.immutable else takes, policy)


@dataclass(frozen=True)
class Linked(Chain):
    """A part with Celery's callbacks, which do not change what it hands on: each of `links`
    waits for its result (and gets it first unless immutable), each of `errbacks` waits for
    its end, whatever it is (the errback job decides whether its task failed)."""

    links: tuple[Part, ...] = ()
    errbacks: tuple[TaskSignature, ...] = ()

    def into(self, build: Any, waits: Any, near: str) -> Any:
        out = super().into(build, waits, near)
        if out.many and self.links:
            raise InvalidOption(
                "link on a group (or a chain or chord that ends with one) is "
                "refused: Celery would run it after the group's first member "
                "only; use a chord to call back once all are done"
            )
        for link in self.links:
            build.add(link, out.ruled("f"), near)
        for errback in self.errbacks:
            build.add(errback, out.ruled("i"), near)
        return out


@dataclass(frozen=True)
class Inherited:
    """What a part of a canvas takes from around it: `every`, options for each of its tasks that
    does not set its own; `start`, options for the tasks that start it; `errbacks`, the
    link_error signatures its tasks inherit; `header`, the chord header jobs (id, queue) whose
    failure the errbacks of a chord callback's first tasks report."""

    every: Mapping[str, Any] = field(default_factory=dict)
    start: Mapping[str, Any] = field(default_factory=dict)
    errbacks: tuple[Any, ...] = ()
    header: tuple[tuple[str, str], ...] = ()

    def within(self, own: Mapping[str, Any], errbacks: list[Any]) -> Inherited:
        """This scope with a composite's own options and errbacks added (its own first)."""
        every = {k: v for k, v in own.items() if k not in START_OPTIONS}
        start = {k: v for k, v in own.items() if k in START_OPTIONS}
        return Inherited(
            {**self.every, **every}, {**self.start, **start}, (*self.errbacks, *errbacks), self.header
        )

    def later(
        self, errbacks: tuple[Any, ...] | None = None, header: tuple[tuple[str, str], ...] = ()
    ) -> Inherited:
        """The scope of a part that does not start the composite (a chain's later step, a
        chord's callback, a link callback)."""
        return Inherited(self.every, {}, self.errbacks if errbacks is None else errbacks, header)


class Canvas:
    """A Celery canvas being compiled into jobqueue's composition."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.tasks: list[tuple[str, str]] = []
        """The tasks compiled so far (job id, queue), in order."""
        self._results: dict[int, Any] = {}
        """What Celery would return for each part compiled (by the part's id()): a JobResult
        whose `parent` is the step before (a chain's), or the header (a chord's), as Celery
        links them; a JobGroupResult for a group."""

    def part(
        self,
        sig: Any,
        args: tuple[Any, ...] = (),
        kwargs: Mapping[str, Any] | None = None,
        scope: Inherited | None = None,
    ) -> Part:
        """`sig` as a part of a flow, `args` and `kwargs` prepended to (merged into) those of
        the tasks that start it."""
        sig, kwargs, scope = self._signature(sig), kwargs or {}, scope or Inherited()
        if isinstance(sig, (celery.chunks, celery._basemap)):
            raise InvalidOption(
                f"Celery's {type(sig).__name__} is not mapped to jobqueue: "
                "write a group of the task's signatures instead"
            )
        if not isinstance(sig, (celery._chain, celery.group, celery._chord)):
            return self._task(sig, args, kwargs, scope)
        own = dict(sig.options)
        links, errbacks = _listed(own.pop("link", None)), _listed(own.pop("link_error", None))
        if own.pop("task_id", None) is not None:
            raise InvalidOption(
                f"a {_kind(sig)}'s task_id (given, or set by .freeze()) is refused: jobqueue "
                "mints a flow's ids; set task_id (a jobqueue id) on a task's signature"
            )
        if sig.immutable:
            args, kwargs = tuple(sig.args), {}
        else:
            args = (*args, *sig.args)
        scope = scope.within(own, errbacks)
        built = self._composite(sig, args, kwargs, scope)
        if not links:
            return built
        return self._same(Linked((built,), links=self._links(links, scope)), built)

    def _composite(
        self, sig: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any], scope: Inherited
    ) -> Part:
        if isinstance(sig, celery._chain):
            steps = _members(sig.tasks, "chain")
            parts = [self.part(steps[0], args, kwargs, scope),
                     *(self.part(step, scope=scope.later()) for step in steps[1:])]
            for earlier, step in itertools.pairwise(parts):
                _first(self._results[id(step)]).parent = self._results[id(earlier)]
            return self._same(chain(*parts), parts[-1])
        if isinstance(sig, celery.group):
            parts = [self.part(member, args, kwargs, scope) for member in _members(sig.tasks, "group")]
            return self._keep(group(parts), self._together(parts))
        tasks = sig.tasks.tasks if isinstance(sig.tasks, celery.group) else sig.tasks
        if sig.body is None:
            raise InvalidOption(
                "a chord needs a callback: chord(header)(callback) or chord(header, callback)"
            )
        kwargs = {**(sig.kwargs.get("kwargs") or {}), **kwargs}
        on_header = ()  # (Celery's default: a chord's errbacks go to its callback only)
        if self.app.conf.task_allow_error_cb_on_chord_header:
            on_header = tuple(
                self._signature(errback).clone().set(immutable=True) for errback in scope.errbacks
            )
        before = len(self.tasks)
        members = [
            self.part(member, args, kwargs, Inherited(scope.every, scope.start, on_header))
            for member in _members(tasks, "chord's header")
        ]
        body = self.part(sig.body, scope=scope.later(header=tuple(self.tasks[before:])))
        _first(self._results[id(body)]).parent = self._together(members)
        return self._same(chord(members, body), body)

    def _task(self, sig: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any], scope: Inherited) -> Part:
        task = self._bridged(sig)
        own = {**scope.every, **scope.start, **sig.options}
        links, errbacks = _listed(own.pop("link", None)), _listed(own.pop("link_error", None))
        if sig.immutable:
            args, kwargs = tuple(sig.args), dict(sig.kwargs)
        else:
            args, kwargs = (*args, *sig.args), {**sig.kwargs, **kwargs}
        call = task.job_call(args, kwargs, own)
        job = (call.spec.setdefault("job_id", ids.new_id()), call.queue)
        self.tasks.append(job)
        built = self._keep(TaskSignature.of(task, call, task.run, immutable=bool(sig.immutable)),
                           JobResult(*job, app=self.app))
        watching = [self._errback(errback, job, scope) for errback in (*scope.errbacks, *errbacks)]
        if not links and not watching:
            return built
        return self._same(Linked(
            (built,),
            links=self._links(links, scope),
            errbacks=tuple(watching),
        ), built)

    def _links(self, links: list[Any], scope: Inherited) -> tuple[Part, ...]:
        """Link callbacks as parts (with no errbacks of the canvas's), not counted among the
        canvas's tasks (a chord callback's errback reports its header's tasks, not theirs)."""
        before = len(self.tasks)
        parts = tuple(self.part(link, scope=scope.later(())) for link in links)
        del self.tasks[before:]
        return parts

    def _errback(self, sig: Any, watched: tuple[str, str], scope: Inherited) -> TaskSignature:
        """An errback job of `watched`: it waits for the task's end and is handed its outcome
        first; the bridge's worker calls the errback only if the task failed (celery.py)."""
        sig = self._signature(sig)
        if not isinstance(sig, celery.Signature) or sig.subtask_type:
            raise InvalidOption(f"link_error takes a task's signature, got a {_kind(sig)}")
        task = self._bridged(sig)
        call = task.job_call(sig.args, sig.kwargs, {**scope.every, **sig.options})
        call.spec.setdefault("job_id", ids.new_id())
        watch = {
            "of": list(watched),
            "header": [list(job) for job in scope.header],
            "immutable": bool(sig.immutable),
        }
        return TaskSignature.of(task, call, _takes_anything, watch=watch)

    def _signature(self, sig: Any) -> Any:
        """A Celery signature (or a dict of one) of this app; InvalidOption for anything else."""
        if not isinstance(sig, dict):  # (a Signature is a dict)
            raise InvalidOption(f"a canvas takes Celery signatures (task.s(...)), got {sig!r:.200}")
        return celery.maybe_signature(sig, app=self.app)

    def _bridged(self, sig: Any) -> BridgedTask:
        """The signature's task, when it runs on jobqueue (InvalidOption otherwise)."""
        try:
            task = sig.type
        except (KeyError, NotRegistered):
            raise InvalidOption(
                f"task {sig.task!r} of the canvas is not registered in the Celery app"
            ) from None
        if not isinstance(task, BridgedTask):
            raise InvalidOption(
                f"task {sig.task!r} is not a jobqueue task (its class is not "
                "JobTask): a canvas runs all its tasks on jobqueue, or none"
            )
        return task

    def _keep(self, part: Any, result: Any) -> Any:
        """`part`, whose result (as Celery returns it) is `result`."""
        self._results[id(part)] = result
        return part

    def _same(self, part: Any, inner: Any) -> Any:
        """`part`, whose result is that of `inner` (a part it wraps or ends with)."""
        return self._keep(part, self._results[id(inner)])

    def _together(self, parts: list[Any]) -> JobGroupResult:
        """A group's result: its members', a nested group's spliced in (as jobqueue hands on
        their results, and Celery unrolls a chord's header); its id is the flow's at the top,
        else unknown."""
        results: list[Any] = []
        for part in parts:
            made = self._results[id(part)]
            results += made.results if isinstance(made, JobGroupResult) else [made]
        return JobGroupResult(None, results, app=self.app)

    def result(self, part: Part, ref: JobRef | GroupRef) -> JobResult | JobGroupResult:
        """What Celery's apply_async returns for the canvas compiled as `part` and enqueued as
        `ref`, answered by jobqueue: the result job's JobResult, its `parent` the one before
        it, and so on back to the start (a chord's callback's parent is its header's
        JobGroupResult), or a group's JobGroupResult (its id the flow's)."""
        made = self._results[id(part)]
        if isinstance(ref, JobRef):  # (the flow's result job is the canvas's last)
            return made if made.id == ref.id else JobResult(ref.id, ref.queue, app=self.app)
        if [each.id for each in made.results] != [each.id for each in ref.refs]:  # (unforeseen:
            flat = JobGroupResult(None, [JobResult(each.id, each.queue, app=self.app)  # what
                                         for each in ref.refs], app=self.app)  # the flow says)
            flat.parent, made = made.parent, flat
        made.id = ref.id
        return made


def apply(
    sig: Any,
    args: Iterable[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    options: Mapping[str, Any] | None = None,
) -> JobResult | JobGroupResult:
    """Enqueue a canvas of bridged tasks as one flow (`options`: apply_async's, over the
    canvas's own); InvalidOption, with nothing written, for what cannot be mapped."""
    kwargs = dict(kwargs or {})
    canvas = sig.clone()  # (the options of this call, over the canvas's own, on a copy)
    if isinstance(canvas, celery._chord) and "body" in kwargs:  # (chord(header)(callback))
        canvas.body = kwargs.pop("body")
    canvas.options.update({k: v for k, v in (options or {}).items() if v is not None})
    compiler = Canvas(canvas.app)
    part = compiler.part(canvas, tuple(args), kwargs)
    return compiler.result(part, (chain(part) if isinstance(part, Signature) else part).enqueue())


def _first(result: Any) -> Any:
    """The earliest result `result`'s parents lead back to (itself when it has none)."""
    while result.parent is not None:
        result = result.parent
    return result


def _takes_anything(*args: Any, **kwargs: Any) -> None:
    """What an errback job's handler takes: its watched task's outcome before its own arguments
    (the worker reshapes them as Celery calls an errback)."""


def _listed(value: Any) -> list[Any]:
    """A link option as a list: one signature, or several."""
    if not value:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _members(tasks: Any, what: str) -> list[Any]:
    found = list(tasks or ())
    if not found:
        raise InvalidOption(f"an empty {what} is refused: there is nothing to run")
    return found


def _kind(sig: Any) -> str:
    names = {celery._chain: "chain", celery.group: "group", celery._chord: "chord"}
    return next((name for cls, name in names.items() if isinstance(sig, cls)), type(sig).__name__)


def _holds_bridged(sig: Any) -> bool:
    """Whether a canvas holds a task that runs on jobqueue (its own, not Celery's built-ins)."""
    sig = celery.maybe_signature(sig)
    if isinstance(sig, (celery.chunks, celery._basemap)):
        return _holds_bridged(sig.kwargs.get("task"))
    if isinstance(sig, celery._chord):
        tasks = sig.tasks.tasks if isinstance(sig.tasks, celery.group) else sig.tasks
        return any(_holds_bridged(each) for each in (*tasks, sig.body) if each is not None)
    if isinstance(sig, (celery._chain, celery.group)):
        return any(_holds_bridged(each) for each in sig.tasks)
    try:
        return isinstance(sig.type, BridgedTask) and not sig.task.startswith("celery.")
    except (AttributeError, KeyError, NotRegistered):
        return False


def _diverted(original: Callable[..., Any]) -> Callable[..., Any]:
    """`original` (a canvas class's apply_async) for a canvas of Celery's own tasks, `apply`
    when it holds a bridged one (a chord's callback given as `chord(header)(callback)` too)."""

    @functools.wraps(original)
    def apply_async(self: Any, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
        body = (kwargs or {}).get("body") if isinstance(self, celery._chord) else None
        if not _holds_bridged(self) and not (body is not None and _holds_bridged(body)):
            return original(self, args, kwargs, **options)
        return apply(self, args or (), kwargs or {}, options)

    apply_async.jobqueue_bridge = True  # type: ignore[attr-defined]
    return apply_async


def install() -> None:
    """Divert Celery's canvas classes' `apply_async` to `apply` for canvases holding bridged
    tasks (once per process; other canvases go on to Celery's own)."""
    for cls in (celery._chain, celery.group, celery._chord, celery._basemap, celery.chunks):
        if not getattr(cls.apply_async, "jobqueue_bridge", False):
            cls.apply_async = _diverted(cls.apply_async)
