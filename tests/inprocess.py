"""A real worker run to its end in the test's own process: what its handlers do (signals sent,
modules imported) and what its threads die of are seen by the test."""

from __future__ import annotations

import threading
from typing import Any

from jobqueue.worker import Worker, WorkerConfig


def burst(*queues: str, timeout: float = 60, **options: Any) -> None:
    """Run a burst worker of `queues` (default: `default`) on a thread of this process until it
    ends; fail when it does not end in `timeout` seconds, when it raises, or when any of its
    threads died (a worker that goes on without a thread is a silent zombie)."""
    died: list[str] = []
    previous = threading.excepthook
    threading.excepthook = lambda args: died.append(
        f"{args.thread and args.thread.name}: {args.exc_type.__name__}: {args.exc_value}")
    config = {"concurrency": 2, **options}
    worker = Worker(WorkerConfig(queues=queues or ("default",), burst=True, mirror=False, **config))
    raised: list[BaseException] = []

    def run() -> None:
        try:
            worker.run()
        except BaseException as exc:  # noqa: BLE001 (the test reports it)
            raised.append(exc)

    thread = threading.Thread(target=run, name="test-burst", daemon=True)
    try:
        thread.start()
        thread.join(timeout)
        ended = not thread.is_alive()
        if not ended:
            worker.request_stop()
            worker.request_stop()
            thread.join(30)
    finally:
        threading.excepthook = previous
    assert not died, f"a worker thread died: {died}"
    assert not raised, f"the worker raised {raised[0]!r}"
    assert ended, f"the burst did not end within {timeout}s"
