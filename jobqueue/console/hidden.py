"""Hidden arguments: the argument keys a queue's `hidden_args` option names, shown as `•••` to a
user without the `jobqueue.view_hidden_args` permission, wherever the console shows a job's
arguments (its page, search results, the history list), and kept out of the searches such a
user may make (a search by a hidden key would tell its value by probing). Where a page reads a
job's errors with its payload (its page, its history row's, search results, a flow's, the find
page's history rows), a hidden value an error quotes is masked there too (`shown_errors`).

A name hides that key wherever it stands in the job's kwargs or in a dict among its args, at any
depth; a whole number hides that position of its args. Reads settings only; touches nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from django.http import HttpRequest

from ..conf import get_config
from ..records import JobInfo

PERMISSION = "jobqueue.view_hidden_args"
MASK = "•••"
SHORTEST = 4
"""A hidden value shorter than this, as text, is not looked for in a job's errors (a "1" or an
"id" would mask half a traceback and tell little)."""


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


def shown_errors(request: HttpRequest, info: JobInfo) -> JobInfo:
    """`info` with each hidden argument's value its errors quote (last error, attempts) shown as
    MASK, unless the user may see hidden arguments."""
    found = unseen(request, info.queue, info.payload)
    if not found:
        return info
    return replace(info, last_error=mask_text(info.last_error, found),
                   history=tuple(mask_attempts(info.history, found)))


def unseen(request: HttpRequest, queue: str, payload: Any) -> list[str]:
    """The hidden values of a payload of `queue` this user may not see (`values`)."""
    return [] if may_see(request) else values(payload, hidden_for(queue))


def mask_attempts(history: Any, found: list[str]) -> list[Any]:
    """A job's attempts (dicts with an "error"), each error with `found` masked."""
    return [{**item, "error": mask_text(item.get("error"), found)} if isinstance(item, dict)
            else item for item in history or ()]


def values(payload: Any, hidden: tuple[str | int, ...]) -> list[str]:
    """The texts (SHORTEST characters or more, longest first) of the values `hidden` hides in a
    payload: every leaf of a hidden argument."""
    if not hidden or not isinstance(payload, dict):
        return []
    names = {key for key in hidden if isinstance(key, str)}
    positions = {key for key in hidden if isinstance(key, int)}
    found: list[str] = []
    if isinstance(payload.get("args"), list):
        for i, arg in enumerate(payload["args"]):
            _leaves(arg, found) if i in positions else _named(arg, names, found)
    _named(payload.get("kwargs"), names, found)
    return sorted({text for text in found if len(text) >= SHORTEST}, key=len, reverse=True)


def mask_text(text: Any, found: list[str]) -> Any:
    """`text` with each of `found` in it shown as MASK (anything but a string as it is)."""
    if not isinstance(text, str):
        return text
    for value in found:
        text = text.replace(value, MASK)
    return text


def _named(value: Any, names: set[str], found: list[str]) -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            _leaves(item, found) if key in names else _named(item, names, found)
    elif isinstance(value, list):
        for item in value:
            _named(item, names, found)


def _leaves(value: Any, found: list[str]) -> None:
    if isinstance(value, dict | list):
        for item in value.values() if isinstance(value, dict) else value:
            _leaves(item, found)
    elif value is not None and not isinstance(value, bool):
        found.append(str(value))
