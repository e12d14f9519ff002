"""A flow once composed: its graph written on its queues' shards (graph.py), its members'
outcomes relayed across shards and queues (relay.py: the `:outcomes` streams and the deliver
script), its jobs listed or cancelled (members.py). Composing flows (chain, group, chord) is the api's.

May import: the engine, models, the leaves. The one room `__init__` that imports: the docs call
`jobqueue.flows.members` and `jobqueue.flows.cancel` (after `from jobqueue import flows`).
"""

from .members import cancel, members, waits_for

__all__ = ["cancel", "members", "waits_for"]
