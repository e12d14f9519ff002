"""Create the demo superuser (admin/admin) and enqueue sample jobs."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

from jobqueue.conf import get_client
from project.demo import codemojex, jobs


class Command(BaseCommand):
    help = "Create user admin/admin and enqueue sample jobs for the demo."

    def handle(self, *args: Any, **options: Any) -> None:
        user_model = get_user_model()
        if not user_model.objects.filter(username="admin").exists():
            user_model.objects.create_superuser("admin", "admin@example.com", "admin")
        jobs.send_welcome_email.enqueue_many([(i,) for i in range(40)])
        for player in range(5):
            jobs.send_welcome_email.using(lane=f"player-{player}", priority=player).enqueue(player)
        jobs.flaky_delivery.enqueue_many([(f"user{i}@example.com",) for i in range(10)])
        jobs.always_fails.enqueue("<script>alert('the admin escapes this')</script>")
        jobs.import_rows.enqueue(200)
        jobs.send_welcome_email.using(delay=60).enqueue(999)
        get_client().delete(codemojex.STATS)  # a new game
        codemojex.new_round()  # (a flow at once: the players' loop closes one every 10 s)
        self.stdout.write("enqueued sample jobs on queues 'default', 'emails' and 'cm'")
