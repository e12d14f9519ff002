"""jobqueue's enqueue in a process of its own, for bench/peers.py's `--baseline` peer (another
checkout's code): `python jq_enqueue.py N single|bulk HANDLER` enqueues N jobs and prints
{"seconds": …}. PYTHONPATH names the checkout whose code runs."""

from __future__ import annotations

import json
import os
import sys
import time

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench_settings")
import django

django.setup()
from benchapp import jobs  # noqa: E402

n, mode, handler = int(sys.argv[1]), sys.argv[2], sys.argv[3]
tick = getattr(jobs, handler)
started = time.perf_counter()
if mode == "single":
    for _ in range(n):
        tick.enqueue()
else:
    tick.enqueue_many([() for _ in range(n)])
print(json.dumps({"seconds": time.perf_counter() - started}))
