"""bench/batches.py's handlers: each inserts one row per job (an app of its own: a worker of a
project with batch handlers looks at each claimed job for them, which the other benches' workers
must not pay)."""

from jobqueue import job


@job(queue="rows")
def row_each(value: int) -> int:
    """bench/batches.py, one job per call: one INSERT per job."""
    from batchapp.models import BatchRow

    BatchRow.objects.create(job="single", value=value)
    return value


@job(queue="rows", batch=100, batch_wait=0.05)
def row_batch(items):  # type: ignore[no-untyped-def]
    """bench/batches.py, batch=100: one bulk INSERT per call."""
    from batchapp.models import BatchRow

    BatchRow.objects.bulk_create([BatchRow(job="batch", value=item.args[0]) for item in items])
    return [item.args[0] for item in items]
