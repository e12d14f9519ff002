"""django-vtasks' enqueue for bench/peers.py, in its own Django project: `python
vtasks_enqueue.py N` enqueues N ticks one call each and prints {"seconds": …}."""

from __future__ import annotations

import json
import os
import sys
import time

os.environ["DJANGO_SETTINGS_MODULE"] = "vtasks_settings"
import django

django.setup()
from vtasks_app.tasks import tick  # noqa: E402

n = int(sys.argv[1])
started = time.perf_counter()
for _ in range(n):
    tick.enqueue()
print(json.dumps({"seconds": time.perf_counter() - started}))
