"""`JOBQUEUE["CONSOLE"]`: which Django groups may view, or act on, which queues in the console,
parsed once with the rest of the settings (conf.py), so `manage.py check` names a wrong entry
(jobqueue.E009). What a grant lets a user do is decided in `access.py`, the one place the
console asks.

    JOBQUEUE = {"CONSOLE": {
        "ACCESS": {
            "billing": {"view": ["support"], "act": ["billing-ops"]},
            "*": {"act": ["ops"]},       # every queue
        },
        "OPEN_BY_DEFAULT": False,        # default: True while ACCESS is empty, else False
    }}

A leaf: imports only the exceptions, the key rules and the "did you mean" helper.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from .exceptions import ConfigurationError, JobQueueError
from .keys import validate_queue
from .options import did_you_mean

VIEW, ACT = "view", "act"
"""The two levels: `view` shows a queue and its jobs; `act` also lets the user's Django
permissions act on them (retry, cancel, reprioritize, pause, resize, caps, periodic jobs)."""
LEVELS = (VIEW, ACT)
EVERY_QUEUE = "*"
"""An `ACCESS` key granting its levels on every queue."""
WHERE = "JOBQUEUE['CONSOLE']"


@dataclass(frozen=True)
class Grants:
    """The parsed `JOBQUEUE["CONSOLE"]` access settings."""

    access: Mapping[str, Mapping[str, frozenset[str]]] = field(
        default_factory=lambda: MappingProxyType({}))
    """Queue name (or "*") -> level -> the Django group names granted it."""
    open_by_default: bool = True
    """Whether a queue `access` does not name is open to every console user (as before grants
    existed); a queue it names is always limited to its grants."""

    def levels(self, queue: str, groups: frozenset[str]) -> frozenset[str]:
        """The levels users of `groups` hold on `queue` by grant (act includes view); the
        queue's openness is the caller's (`open_by_default`)."""
        held: set[str] = set()
        for key in (queue, EVERY_QUEUE):
            for level, granted in self.access.get(key, {}).items():
                if granted & groups:
                    held.add(level)
        return frozenset({VIEW, ACT} if ACT in held else held)

    def named(self, queue: str) -> bool:
        """Whether `ACCESS` names `queue` itself (its grants alone decide who sees it)."""
        return queue in self.access


def parse(raw: Any) -> Grants:
    """Validate `JOBQUEUE["CONSOLE"]` into Grants, naming the first wrong entry."""
    if not isinstance(raw, dict):
        raise ConfigurationError(f"{WHERE} must be a dict, got {raw!r}")
    known = {"ACCESS", "OPEN_BY_DEFAULT"}
    unknown = set(raw) - known
    if unknown:
        raise ConfigurationError(f"{WHERE}: unknown key(s) {sorted(map(str, unknown))}"
                                 f"{did_you_mean(unknown, known)}; allowed: {sorted(known)}")
    access = raw.get("ACCESS", {})
    if not isinstance(access, dict):
        raise ConfigurationError(f"{WHERE}['ACCESS'] must be a dict of queue names, got {access!r}")
    parsed = {_queue(name): _levels(name, levels) for name, levels in access.items()}
    open_by_default = raw.get("OPEN_BY_DEFAULT", not parsed)
    if not isinstance(open_by_default, bool):
        raise ConfigurationError(f"{WHERE}['OPEN_BY_DEFAULT'] must be True or False, "
                                 f"got {open_by_default!r}")
    return Grants(MappingProxyType(parsed), open_by_default)


def _queue(name: Any) -> str:
    if name == EVERY_QUEUE:
        return name
    try:
        return validate_queue(name)
    except JobQueueError as exc:
        raise ConfigurationError(f"{WHERE}['ACCESS']: {exc} (or '*' for every queue)") from None


def _levels(queue: str, raw: Any) -> Mapping[str, frozenset[str]]:
    where = f"{WHERE}['ACCESS'][{queue!r}]"
    if not isinstance(raw, dict) or not raw:
        raise ConfigurationError(f"{where} must be a dict such as {{'view': ['support'], "
                                 f"'act': ['ops']}}, got {raw!r}")
    unknown = set(raw) - set(LEVELS)
    if unknown:
        raise ConfigurationError(f"{where}: unknown level(s) {sorted(map(str, unknown))}"
                                 f"{did_you_mean(unknown, LEVELS)}; allowed: {list(LEVELS)}")
    levels = {}
    for level, groups in raw.items():
        if isinstance(groups, str) or not isinstance(groups, list | tuple | set | frozenset) \
                or not all(isinstance(g, str) and g for g in groups):
            raise ConfigurationError(f"{where}[{level!r}] must be a list of Django group names, "
                                     f"got {groups!r}")
        levels[level] = frozenset(groups)
    return MappingProxyType(levels)
