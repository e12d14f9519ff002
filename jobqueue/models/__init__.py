"""The database's tables (Django looks for them here): the history of jobs and the shards of
each queue (history.py), and what the console and its operators keep (console.py: bulk
operations, the history charts' rollup, periodic jobs edited in the admin).

Imports the leaves only (a worker's pool process imports the worker's modules before Django is
set up, so nothing on that path imports this package at its top).
"""

from .console import ALL_COUNTS, BINS, COUNTS, OUTCOMES, RUN, WAIT, BulkOperation, Rollup, Schedule
from .history import (
                      HANDLER_LENGTH,
                      STATEMENT_BYTES,
                      UNFINISHED,
                      CaseSensitiveCharField,
                      Job,
                      Shard,
                      _quotes_values,
                      counted_rows,
                      insert_jobs,
                      reopened,
                      stale_events,
                      written_fields,
)

__all__ = ["ALL_COUNTS", "BINS", "COUNTS", "HANDLER_LENGTH", "OUTCOMES", "RUN", "STATEMENT_BYTES",
           "UNFINISHED", "WAIT", "BulkOperation", "CaseSensitiveCharField", "Job", "Rollup",
           "Schedule", "Shard", "_quotes_values", "counted_rows", "insert_jobs", "reopened",
           "stale_events", "written_fields"]
