"""Access per queue: THE one place that decides which queues a console user sees and acts on.

Every page, action, search, list and admin changelist of the console asks here, and nowhere
else; a new page or action must too:

- `visible_queues(request, names=None)`: the queues (of `names`, else every known queue) the
  user may see, for a page that lists queues (dashboard, stuck jobs, …);
- `reach(request, acting=False)`: the queue names a search (live or history), its bulk action or
  the charts may read for the user (act on): None for every queue, else a set that a bulk
  operation records and its runner keeps to, however often it is resumed;
- `may_view(request, queue)` / `may_act(request, queue)`: one queue (`act` is what an action
  needs on top of its own Django permission);
- `require_view(request, queue)`: a page or action naming a queue in its URL; a queue the user
  may not see is a 404 (as an unknown job id is), so an id typed into the URL does not tell
  whether the job exists;
- `require_act(request, queue)`: an action; 404 when the queue is not visible, 403 when it is
  visible only;
- `history(request, queryset)`: a `Job` (or `Shard`) queryset narrowed to the visible queues
  (the history changelist, its bulk actions, a search of the history);
- `workers(request, found)`: the workers page's entries with other queues' work left out.

The rule (settings in `JOBQUEUE["CONSOLE"]`, parsed by jobqueue/grants.py): a superuser sees and acts
everywhere. Otherwise a queue that `ACCESS` names is seen by the groups granted `view` or `act`
on it (or on "*") and acted on by those granted `act`; a queue it does not name is open to every
console user while `OPEN_BY_DEFAULT` is True (its default while `ACCESS` is empty: no grant
configured, the console is as before) and otherwise only to the groups granted on "*". Django's
permissions still apply on top: `act` never gives a user an action their permissions lack.
The user's levels are worked out once per request (`scope`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest

from ..conf import get_config
from ..grants import ACT, EVERY_QUEUE, VIEW, Grants

CACHE = "_jobqueue_access"
"""The request attribute holding the user's `Scope` for the rest of the request."""


@dataclass(frozen=True)
class Scope:
    """What one user may do, by queue."""

    grants: Grants
    groups: frozenset[str]
    superuser: bool

    def levels(self, queue: str) -> frozenset[str]:
        if self.superuser:
            return frozenset(LEVELS)
        held = self.grants.levels(queue, self.groups)
        if not self.grants.named(queue) and self.grants.open_by_default:
            return frozenset(LEVELS)
        return held

    def unrestricted(self) -> bool:
        """Whether the user sees every queue there is, whatever its name."""
        return self.superuser or (self.grants.open_by_default and not self.grants.access) or (
            VIEW in self.grants.levels("*", self.groups)
            and all(VIEW in self.levels(queue) for queue in self.grants.access))


LEVELS = (VIEW, ACT)


def scope(request: HttpRequest) -> Scope:
    """The user's levels (worked out once per request)."""
    found = getattr(request, CACHE, None)
    if found is None:
        user = request.user
        grants = get_config().console
        groups = frozenset(user.groups.values_list("name", flat=True)) if grants.access and \
            user.is_authenticated and not user.is_superuser else frozenset()
        found = Scope(grants, groups, bool(user.is_superuser))
        setattr(request, CACHE, found)
    return found


def may_view(request: HttpRequest, queue: str) -> bool:
    return VIEW in scope(request).levels(queue)


def may_act(request: HttpRequest, queue: str) -> bool:
    return ACT in scope(request).levels(queue)


def visible_queues(request: HttpRequest, names: Iterable[str] | None = None) -> list[str]:
    """The queues of `names` (every known queue when None) the user may see, in order."""
    if names is None:
        from ..engine.store import known_queues

        names = known_queues()
    found = scope(request)
    return [name for name in names if VIEW in found.levels(name)]


def reach(request: HttpRequest, acting: bool = False) -> frozenset[str] | None:
    """The queue names the user may see (`acting`: act on) in a search, its bulk action and the
    charts: None for every queue; else the queues Valkey knows that they may see (act on), and
    every queue `ACCESS` grants them by name, whose history stays theirs once Valkey has
    forgotten the queue (a name granted to nobody, or gone and unnamed, is not reached)."""
    found = scope(request)
    if found.superuser or (found.grants.open_by_default and not found.grants.access) or (
            not acting and found.unrestricted()):
        return None  # (no grant configured: every console user sees and acts everywhere)
    from ..engine.store import known_queues

    level = ACT if acting else VIEW
    names = set(known_queues()) | {name for name in found.grants.access if name != EVERY_QUEUE}
    return frozenset(name for name in names if level in found.levels(name))


def require_view(request: HttpRequest, queue: str) -> None:
    """Http404 unless the user may see `queue` (the same answer as for a job that is not there)."""
    if not may_view(request, queue):
        raise Http404(f"No queue {queue!r} here.")


def require_act(request: HttpRequest, queue: str) -> None:
    """Http404 unless the user may see `queue`; PermissionDenied unless they may act on it."""
    require_view(request, queue)
    if not may_act(request, queue):
        raise PermissionDenied(f"You may view queue {queue!r} but not act on it.")


def history(request: HttpRequest, queryset: Any) -> Any:
    """`queryset` (of rows with a `queue` column) narrowed to the queues the user may see."""
    found = scope(request)
    if found.unrestricted():
        return queryset
    named = found.grants.access
    hidden = [q for q in named if q != "*" and VIEW not in found.levels(q)]
    if VIEW in found.grants.levels("*", found.groups) or found.grants.open_by_default:
        return queryset.exclude(queue__in=hidden)  # every queue but the hidden named ones
    return queryset.filter(queue__in=[q for q in named if q != "*" and q not in hidden])


VEILED = "—"
"""A worker's count shown to a user who may not see every queue it serves."""


def workers(request: HttpRequest, found: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The workers' entries, each showing only the queues (and running jobs) the user may see;
    a worker serving none of them is left out. One that also serves a queue the user may not
    see shows none of its counts over every queue it serves (processed, failed, rate,
    overrunning), and as running only the jobs it shows."""
    if scope(request).unrestricted():
        return found
    shown = []
    for entry in found:
        serves = entry.get("queues") or []
        queues = visible_queues(request, serves)
        if not queues:
            continue
        jobs = [(queue, job) for queue, job in entry.get("jobs") or [] if may_view(request, queue)]
        entry = {**entry, "queues": queues, "jobs": jobs}
        if len(queues) < len(serves):
            entry.update(dict.fromkeys(("processed", "failed", "rate"), VEILED),
                         running=len(jobs), overrunning=0)
        shown.append(entry)
    return shown
