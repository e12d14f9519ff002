"""What an operator would find in a shop's console, for the docs' screenshots
(test_docs_shots.py): queues with waiting and dead jobs in tenants' lanes, a chord under way, a
week of finished history (the charts' rollup written with it, as the mirror writes it), a stored
schedule beside the settings' ones."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta

from jobqueue import Queue, chord
from jobqueue.history.mirror import upsert
from jobqueue.models import Schedule
from jobqueue.spec import JobSpec
from tests.jobapp import jobs

TENANTS = ("acme", "globex", "initech", "umbrella")
RECEIPT, CHARGE, REPORT = "shop.jobs.send_receipt", "billing.jobs.charge_card", "reports.jobs.build_report"
SMTP = ("Traceback (most recent call last):\n  File \"shop/jobs.py\", line 41, in send_receipt\n"
        "    smtp.send_message(message)\nsmtplib.SMTPRecipientsRefused: 550 mailbox unavailable\n")
DECLINED = "billing.errors.CardDeclined: do_not_honor (issuer 4021)"
QUEUES = {"emails": {}, "billing": {"hidden_args": ["card"]}, "reports": {}}
"""The scene's queues (billing hides its card argument from those without the permission)."""


def live_jobs() -> dict[str, list[str]]:
    """Receipts waiting in each tenant's lane and acme's dead ones (its mail server refused them),
    charges waiting and declined, and a chord of report parts: the ids by what they are."""
    emails, billing = Queue("emails"), Queue("billing")
    emails.enqueue_many([
        JobSpec({"handler": RECEIPT, "args": [f"order-{2000 + i}"], "kwargs": {"tenant": tenant}},
                lane=tenant, max_attempts=3)
        for i, tenant in enumerate(TENANTS * 30)
    ])
    dead = emails.enqueue_many([
        JobSpec({"handler": RECEIPT, "args": [f"order-{1700 + i}"],
                 "kwargs": {"tenant": "acme", "to": f"orders+{i}@acme.example"}},
                lane="acme", max_attempts=1)
        for i in range(64)
    ])
    _fail(emails, SMTP)
    declined = billing.enqueue_many([
        JobSpec({"handler": CHARGE, "args": [f"order-{1800 + i}"],
                 "kwargs": {"tenant": TENANTS[i % 4], "amount": 1999 + 500 * i,
                            "card": f"4111-…-{1000 + i}"}},
                lane=TENANTS[i % 4], max_attempts=1)
        for i in range(6)
    ])
    _fail(billing, DECLINED)
    waiting = billing.enqueue_many([
        JobSpec({"handler": CHARGE, "args": [f"order-{2100 + i}"],
                 "kwargs": {"tenant": TENANTS[i % 4], "amount": 2499, "card": f"5500-…-{2000 + i}"}},
                lane=TENANTS[i % 4])
        for i in range(9)
    ])
    flow = chord([jobs.add.using(queue="reports").s(i, i) for i in range(12)],
                 jobs.total.using(queue="reports").s()).enqueue()
    return {"dead": [ref.id for ref in dead], "declined": [ref.id for ref in declined],
            "charges": [ref.id for ref in waiting], "chord": [flow.id]}


def _fail(queue: Queue, error: str) -> None:
    while leases := queue.dequeue(count=500):
        for lease in leases:
            queue.nack(lease, error)


def history_week(now: datetime | None = None) -> int:
    """A week of finished jobs on emails, billing and reports, busier in the afternoons (UTC),
    with a bad hour for billing yesterday: mirrored as a worker mirrors them (upsert), so the
    charts' rollup is written with them. The number of rows."""
    now = now or datetime.now(UTC)
    batches: dict[str, list[dict[str, str]]] = {"emails": [], "billing": [], "reports": []}
    n = 0
    for hours_ago in range(7 * 24):
        at = now - timedelta(hours=hours_ago)
        busy = 3 + round(9 * (1 + math.sin((at.hour - 9) / 24 * 2 * math.pi)))
        for i in range(busy):
            n += 1
            queue, handler, run_ms = [("emails", RECEIPT, 180.0), ("billing", CHARGE, 650.0),
                                      ("reports", REPORT, 4200.0)][n % 3]
            outage = queue == "billing" and 26 <= hours_ago <= 28
            dead = (outage and i % 2) or n % 29 == 0
            state = "dead" if dead else "cancelled" if n % 97 == 0 else "succeeded"
            finished = at - timedelta(minutes=(i * 7) % 60)
            run = run_ms * (0.5 + ((n * 37) % 100) / 60)
            wait = 40 + (n * 53) % 900 + (busy * 120 if queue == "reports" else 0)
            batches[queue].append(_row(n, handler, state, finished, run, wait, TENANTS[n % 4], n % 11 == 0))
    for queue, rows in batches.items():
        for start in range(0, len(rows), 500):
            upsert(rows[start:start + 500], queue)
    return n


def _row(n: int, handler: str, state: str, finished: datetime, run_ms: float, wait_ms: float,
         tenant: str, retried: bool) -> dict[str, str]:
    started = finished - timedelta(milliseconds=run_ms)
    row = {
        "id": f"JOB0H{n:09d}", "state": state, "lane": tenant, "attempts": "2" if retried else "1",
        "payload": json.dumps({"handler": handler, "args": [f"order-{n}"], "kwargs": {"tenant": tenant}}),
        "enqueued_at": _ms(started - timedelta(milliseconds=wait_ms)),
        "started_at": _ms(started), "finished_at": _ms(finished),
    }
    if state == "dead":
        row["last_error"] = {CHARGE: DECLINED, RECEIPT: "smtplib.SMTPServerDisconnected: connection closed",
                             REPORT: "TimeoutError: the report store did not answer in 30 s"}[handler]
    return row


def _ms(moment: datetime) -> str:
    return str(int(moment.timestamp() * 1000))


def stored_schedule() -> Schedule:
    """A periodic job kept in the database (the settings hold others, read-only)."""
    return Schedule.objects.create(name="nightly-revenue", job="tests.jobapp.jobs.echo", cron="30 2 * * *",
                                   timezone="Europe/Paris", kwargs={"report": "revenue", "days": 1},
                                   queue="reports", lane="finance", priority=10)
