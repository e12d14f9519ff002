"""How long the admin dashboard takes to render with 20 queues and 100,000 waiting jobs.

    .venv/bin/python bench/console.py
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time

from _common import django_setup, valkey


def main() -> None:
    with valkey() as url, tempfile.TemporaryDirectory() as tmp:
        os.environ["DJANGO_ALLOWED_HOSTS"] = "testserver"
        django_setup(url, f"sqlite:///{tmp}/bench.sqlite3")
        from django.contrib.auth.models import User
        from django.core.management import call_command
        from django.test import Client

        from jobqueue.store import JobSpec, Queue

        call_command("migrate", verbosity=0)
        User.objects.create_superuser("bench", "b@example.com", "pw")
        for n in range(20):
            specs = [JobSpec({"handler": "x", "args": [i], "kwargs": {}}, lane=f"t{i % 50}")
                     for i in range(5_000)]
            Queue(f"queue-{n:02d}").enqueue_many(specs)
        client = Client()
        client.login(username="bench", password="pw")
        timings = []
        for _ in range(15):
            started = time.perf_counter()
            response = client.get("/admin/jobqueue/job/live/")
            timings.append((time.perf_counter() - started) * 1000)
            assert response.status_code == 200 and response.content.count(b"jq-card") >= 20
        queue_page = []
        for _ in range(10):
            started = time.perf_counter()
            client.get("/admin/jobqueue/job/live/queues/queue-07/?state=pending&page=90")
            queue_page.append((time.perf_counter() - started) * 1000)
        print("\nadmin console, 20 queues × 5,000 waiting jobs (100,000), 50 lanes each")
        print(f"  dashboard   median {statistics.median(timings):6.1f} ms   max {max(timings):6.1f} ms")
        print(f"  queue page  median {statistics.median(queue_page):6.1f} ms   (page 90 of pending)")


if __name__ == "__main__":
    main()
