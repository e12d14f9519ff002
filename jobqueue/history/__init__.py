"""The durable floor: terminal events mirrored into the database (mirror.py); durable queues'
rows written before Valkey, pushed, resent and restored (outbox.py). The tables and their row
rules are `jobqueue/models.py`, where Django expects them.

May import: flows, the engine, models, the leaves. This `__init__` imports nothing.
"""
