"""Hidden arguments: the argument keys a queue's `hidden_args` option names, shown as `•••` to a
user without the `jobqueue.view_hidden_args` permission, wherever the console shows a job's
arguments (its page, search results, the history list), and kept out of the searches such a
user may make (a search by a hidden key would tell its value by probing).

A name hides that key wherever it stands in the job's kwargs or in a dict among its args, at any
depth; a whole number hides that position of its args. Reads settings only; touches nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.http import HttpRequest

from ..conf import get_config

PERMISSION = "jobqueue.view_hidden_args"
MASK = "•••"


def may_see(request: HttpRequest) -> bool:
    """Whether the user may see hidden arguments."""
    return bool(request.user.has_perm(PERMISSION))


def hidden_for(queue: str) -> tuple[str | int, ...]:
    """The argument keys `queue` hides (its `hidden_args` option, or DEFAULTS')."""
    return get_config().queue(queue).hidden_args


def any_hidden(queues: Iterable[str] | None) -> tuple[str | int, ...]:
    """Every key hidden in one of `queues` (None: every queue the settings configure, and the
    defaults any other queue has)."""
    config = get_config()
    names = config.queues if queues is None else queues
    found = dict.fromkeys(config.defaults.hidden_args if queues is None else ())
    for name in names:
        found.update(dict.fromkeys(config.queue(name).hidden_args))
    return tuple(found)


def queues_hiding() -> tuple[list[str], list[str], bool]:
    """The configured queues that hide arguments, those that do not, and whether every other
    queue (DEFAULTS' options) does."""
    config = get_config()
    hiding = [name for name, options in config.queues.items() if options.hidden_args]
    return hiding, [name for name in config.queues if name not in hiding], bool(config.defaults.hidden_args)


def mask(payload: Any, hidden: tuple[str | int, ...]) -> Any:
    """A copy of a job's payload with its hidden arguments shown as MASK."""
    if not hidden or not isinstance(payload, dict):
        return payload
    names = {key for key in hidden if isinstance(key, str)}
    positions = {key for key in hidden if isinstance(key, int)}
    shown = dict(payload)
    if isinstance(payload.get("args"), list):
        shown["args"] = [
            MASK if i in positions else _masked(arg, names) for i, arg in enumerate(payload["args"])
        ]
    if "kwargs" in payload:
        shown["kwargs"] = _masked(payload["kwargs"], names)
    return shown


def _masked(value: Any, names: set[str]) -> Any:
    if isinstance(value, dict):
        return {key: MASK if key in names else _masked(item, names) for key, item in value.items()}
    if isinstance(value, list):
        return [_masked(item, names) for item in value]
    return value


def shown_payload(request: HttpRequest, queue: str, payload: Any) -> Any:
    """The payload as this user may see it."""
    return payload if may_see(request) else mask(payload, hidden_for(queue))
