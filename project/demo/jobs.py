"""Sample jobs for the demo: quick ones, slow ones, flaky ones, and one that always fails."""

from __future__ import annotations

import random
import time

from jobqueue import JobContext, job

from . import codemojex  # noqa: F401 - the worker finds handlers in jobs modules: this registers its guess


@job
def send_welcome_email(user_id: int) -> str:
    time.sleep(random.uniform(0.05, 0.3))
    return f"sent to user {user_id}"


@job(queue="emails", max_attempts=4, backoff=2)
def flaky_delivery(address: str) -> str:
    if random.random() < 0.5:
        raise ConnectionError(f"SMTP server did not answer for {address}")
    return f"delivered to {address}"


@job(max_attempts=2, backoff=1)
def always_fails(reason: str) -> None:
    raise RuntimeError(reason)


@job(takes_context=True)
def import_rows(ctx: JobContext, total: int) -> dict[str, int]:
    """A long job that checkpoints its progress, so a restart resumes where it stopped."""
    done = (ctx.checkpoint or {}).get("done", 0)
    while done < total:
        time.sleep(0.2)
        done += 10
        ctx.save_checkpoint({"done": done})
    return {"imported": total}
