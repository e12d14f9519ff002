"""`manage.py codemojex_players [--seconds N]`: the demo's players, guessing until stopped."""

from __future__ import annotations

import contextlib
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from project.demo import codemojex


class Command(BaseCommand):
    help = "Play codemojex: four players guess once a second, one floods 100 guesses a second."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--seconds", type=float, default=None, help="stop after N seconds")

    def handle(self, *args: Any, **options: Any) -> None:
        with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C on the demo
            codemojex.play(options["seconds"])
