"""bench/batches.py's table: one row per job its handlers ran (created by the bench itself:
the app has no migrations)."""

from django.db import models


class BatchRow(models.Model):
    job = models.CharField(max_length=32)
    value = models.IntegerField()

    class Meta:
        app_label = "batchapp"
