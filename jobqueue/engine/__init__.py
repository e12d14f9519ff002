"""The engine: the job-state transitions on Valkey. Owns the Lua transitions, their loader and
the one caller that sends them (`scripts/`), `Queue` (store.py: one method per transition),
claims whose reply was lost, handed back (claims.py), sending jobs to their shards (sending.py),
layouts, placement and the registry (layouts.py), lane caps (lanes.py), lane heads and backlog
figures (backlog.py), `JobRef` and awaiting results (refs.py), the idle wait's protocol
(handoff.py), the short way to a standalone server (wire.py).

May import: the leaves; `jobqueue.models` lazily, for two things only (a durable row reopened
with `Queue.retry`; a result read from the mirror). This `__init__` imports nothing: importing
one module of a room must not load the whole room.
"""
