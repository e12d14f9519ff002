"""How an enqueue goes: now, at the commit of the transactions open in this thread, through a
durable queue's outbox, or inside a producer span (tracing.py); and a handler's short way,
worked out once per configuration (`Route`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import NamedTuple

from django.db import DatabaseError, transaction

from .. import tracing
from .._compat import in_transaction, open_transactions
from ..conf import Config, get_config
from ..engine.refs import JobRef
from ..engine.store import Queue, Template
from ..flows import graph
from ..history import outbox
from ..spec import JobSpec, prepare

log = logging.getLogger("jobqueue.enqueue")


class Route(NamedTuple):
    """How a handler's `enqueue` goes, worked out once per configuration."""

    config: Config
    queue: Queue
    ready: Template | None
    """The handler's options validated and encoded, as a job of its own that each call gives a
    payload and an id (`store.Template`); None when calls need `submit`'s whole way (a durable
    queue, options that differ per call: a job_id, a run_after time; or spans to make:
    tracing.py)."""
    now: bool
    """Whether its jobs go to Valkey at once even inside a transaction."""

    def template(self) -> Template | None:
        """`ready`, when this call may take it: now, not at a transaction's commit."""
        return self.ready if self.now or not in_transaction() else None


def submit(queue: Queue, specs: list[JobSpec], immediate: bool) -> list[JobRef]:
    """Enqueue now, or — inside a transaction (on any database alias) — once it commits
    (nothing if it rolls back; `after_commit` says what a Valkey error then does).

    The ids are minted now so the caller gets them at once; validation also happens now. A
    durable queue's jobs are first written to the database (in the transaction, if any) and
    always reach Valkey after the commit (`immediate` cannot skip that): see outbox.py. Inside
    a transaction on another alias than the rows' own (`outbox.elsewhere`), the rows could not
    roll back with it: they are written once every open transaction has committed, then sent
    (if the database refuses them then, the jobs are sent without rows, as a plain queue's).
    With tracing on, inside a producer span whose context each job carries (tracing.py).
    """
    traced = tracing.tracer()
    if traced is not None:
        return tracing.publish(traced, queue.name, specs,
                               lambda carrying: _submit(queue, carrying, immediate))
    return _submit(queue, specs, immediate)


def _submit(queue: Queue, specs: list[JobSpec], immediate: bool) -> list[JobRef]:
    durable = queue.options.durable
    if not durable and (immediate or not get_config().on_commit or not in_transaction()):
        return queue.enqueue_many(specs)
    prepared = [prepare(spec, queue.options, get_config().max_payload) for spec in specs]
    minted = [spec._replace(job_id=p.job_id) for spec, p in zip(specs, prepared, strict=True)]
    refs = [JobRef(p.job_id, queue.name) for p in prepared]
    if durable and outbox.elsewhere():
        def write_and_push() -> None:
            if _written(lambda: outbox.write(queue, prepared), refs):
                outbox.push(queue, minted)
            else:
                queue.enqueue_many(minted)

        after_commit(write_and_push, refs, UNWRITTEN)
    elif durable:
        outbox.write(queue, prepared)
        after_commit(lambda: outbox.push(queue, minted), refs, WRITTEN)  # (now, outside
    else:  # a transaction)
        after_commit(lambda: queue.enqueue_many(minted), refs, LOST)
    return refs


def submit_flow(queue: Queue, nodes: list[graph.Node], flow: str = "",
                immediate: bool = False) -> list[JobRef]:
    """Enqueue a flow (graph.py) now, or — inside a transaction — once it commits, as `submit`
    does; its refs either way (ids are minted now). `queue`: the flow's; each node may name
    another (a flow across queues: never a durable one, `graph.checked`). A durable queue's
    flow is first written to the database (in the transaction, if any) and reaches Valkey
    after the commit: outbox.py
    (inside a transaction on another alias than the rows' own, both after the commit, as
    `submit` does; a dependency on a job the database lacks is then logged, not raised)."""
    prepared = graph.checked(queue, nodes)
    refs = graph.refs(queue, nodes, prepared)
    if queue.options.durable and outbox.elsewhere():
        def write_and_push() -> None:
            shards = _written(lambda: outbox.write_flow(queue, nodes, prepared, flow), refs)
            if shards is None:
                graph.enqueue(queue, nodes, prepared, flow)
            else:
                outbox.push_flow(queue, nodes, prepared, flow, shards)

        after_commit(write_and_push, refs, UNWRITTEN)
    elif queue.options.durable:
        shards = outbox.write_flow(queue, nodes, prepared, flow)
        after_commit(lambda: outbox.push_flow(queue, nodes, prepared, flow, shards), refs,
                     WRITTEN)
    elif immediate or not get_config().on_commit or not in_transaction():
        return graph.enqueue(queue, nodes, prepared, flow)
    else:
        after_commit(lambda: graph.enqueue(queue, nodes, prepared, flow), refs, LOST)
    return refs


def _written[T](write: Callable[[], T], refs: list[JobRef]) -> T | None:
    """`write`'s answer: durable rows written after the commit of a transaction on another
    alias; None when the database refused them (logged): the caller then sends the jobs to
    Valkey without rows, as a plain queue's, rather than losing them."""
    try:
        return write()
    except DatabaseError as exc:
        log.error("could not write the durable rows of job(s) %s of queue %s after the commit "
                  "(%r); the jobs are sent to Valkey without them, as plain jobs",
                  ", ".join(ref.id for ref in refs), refs[0].queue if refs else "?", exc)
        return None


LOST = "they are lost (a durable queue keeps its jobs through such an error)"
WRITTEN = "their rows are in the database: a worker's resend sends them"
UNWRITTEN = ("their rows were written just before, unless the database refused them too: then "
             "the jobs are lost")
"""What becomes of jobs whose send after the commit failed (`after_commit`'s `fate`)."""


def after_commit(send: Callable[[], object], refs: list[JobRef], fate: str) -> None:
    """Call `send` once every transaction open in this thread has committed, whatever database
    alias each is on (at once when none is: an error then is the caller's); never when one of
    them rolls back. Registered as
    Django's robust on-commit callbacks (so `captureOnCommitCallbacks(execute=True)` sends the
    jobs in a test). A failure to send is logged (ERROR, logger `jobqueue.enqueue`, naming the
    jobs) and never raised: the transaction has committed, and the other callbacks it holds
    must still run. The log says the jobs' `fate`: a plain queue's are lost (LOST); a durable
    queue's rows are in the database, and a worker's resend sends them (WRITTEN), unless the
    send was to write them too (UNWRITTEN)."""
    aliases = open_transactions()
    left = len(aliases)

    def committed() -> None:
        nonlocal left
        left -= 1
        if left <= 0:
            _send_logged(send, refs, fate)

    if not aliases:
        send()
    for alias in aliases:
        transaction.on_commit(committed, using=alias, robust=True)


def _send_logged(send: Callable[[], object], refs: list[JobRef], fate: str) -> None:
    try:
        send()
    except Exception as exc:  # noqa: BLE001 - logged: an error here would drop other callbacks
        log.error("could not send job(s) %s of queue %s to Valkey after the commit (%r); %s",
                  ", ".join(ref.id for ref in refs), refs[0].queue if refs else "?", exc, fate)
