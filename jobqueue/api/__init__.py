"""What application code calls: handlers registered and enqueued (registry.py), how an enqueue
goes — now, at the commit, through the outbox, traced (dispatch.py), flows composed
(composition.py), and what a handler uses while it runs (handler.py; a batch handler's items
and context: batches.py). `jobqueue` re-exports the
public names.

May import: history, flows, the engine, models, the leaves. This `__init__` imports nothing.
"""
