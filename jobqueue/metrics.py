"""`jobqueue.metrics.view`, where the docs and a project's urls.py name it: the metrics live in
`jobqueue.operations.metrics`."""

from .operations.metrics import ValkeyCollector, view

__all__ = ["ValkeyCollector", "view"]
