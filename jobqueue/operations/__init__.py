"""Running jobqueue: Prometheus metrics (metrics.py), `manage.py check` (checks.py), automatic
shard counts (autoscale.py), firing periodic jobs (schedule.py; their parsing is
`jobqueue.cron`).

May import: the api and everything below it; never the worker nor the console. This `__init__`
imports nothing: a worker that fires schedules must not load the metrics.
"""
