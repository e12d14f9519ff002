"""A console search, as its URL says it (GET parameters: shareable): `Query.parse` reads and
checks it, `Query.matches` tells whether a live job matches it (search.py reads Valkey), and
`Term` is one argument term, which search.py turns into the database's own JSON lookups.

`q` holds terms, all of which a job must match: `args.0=42` or `kwargs.order.id=42` (the value
at that path into the job's arguments is what the text reads as in JSON, or the text itself:
`=42` finds 42 and "42", `=true` true and "true"; quotes allow blanks),
`kwargs.email~example.com` (the value's text contains this, in any case), and plain text (a
job's id, lane or unique key, or text within its handler or its arguments). `queue`, `state`,
`handler`, `lane`, `since`, `until` narrow it further; the time range is when a finished job
finished, and when a live one was enqueued. Bad input is one `InvalidOption` saying what is
wrong. Reads nothing; touches nothing.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from ..exceptions import InvalidOption, JobQueueError
from ..keys import validate_lane, validate_queue
from ..states import State

TOKEN = re.compile(r'[^\s"]*"(?:[^"\\]|\\.)*"|\S+')
"""One term of `q`: a run of non-blanks, or one ending in a double-quoted part (which may hold
blanks): `kwargs.name="Ada Lovelace"`, `"two words"`."""
PATH_TERM = re.compile(r"(?P<path>(?:args|kwargs)(?:\.[^.=~]*)*)(?P<op>[=~])(?P<value>.*)", re.S)
KEY = re.compile(r"[A-Za-z0-9_\-:@$]{1,100}")
MAX_DEPTH = 8
MAX_TERMS = 10
MAX_TEXT = 200
WHERE = ("live", "history")
FIELDS = ("q", "queue", "state", "handler", "lane", "since", "until", "where")
"""The GET parameters a search reads (and a bulk operation keeps)."""


@dataclass(frozen=True)
class Term:
    """`path op value`: path[0] is "args" or "kwargs", then keys (or list positions, as ints);
    `value` is the text typed (its quotes removed)."""

    path: tuple[str | int, ...]
    op: str
    """"=" (equals the JSON value typed, or its text) or "~" (contains, in any case)."""
    value: str

    @property
    def values(self) -> list[Any]:
        """The JSON values "=" accepts: what the text reads as (42, true, null), and the text."""
        try:
            parsed = json.loads(self.value)
        except ValueError:
            return [self.value]
        return [parsed, self.value] if not isinstance(parsed, str) else [self.value]

    def found(self, payload: Any) -> tuple[bool, Any]:
        """(whether the path leads somewhere in `payload`, what it leads to)."""
        value = payload
        for key in self.path:
            if isinstance(value, dict) and str(key) in value:
                value = value[str(key)]
            elif isinstance(value, list) and isinstance(key, int) and key < len(value):
                value = value[key]
            else:
                return False, None
        return True, value

    def matches(self, payload: Any) -> bool:
        there, value = self.found(payload)
        if not there:
            return False
        if self.op == "~":
            return str(self.value).casefold() in as_text(value).casefold()
        return any(type(value) is type(want) and value == want for want in self.values)

    def __str__(self) -> str:
        return ".".join(map(str, self.path)) + self.op + self.value


def as_text(value: Any) -> str:
    """A JSON value's text, as a contains-search reads it: a string itself, else its JSON."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


@dataclass(frozen=True)
class Query:
    """A console search (see the module's docstring)."""

    terms: tuple[Term, ...] = ()
    text: tuple[str, ...] = ()
    queue: str = ""
    state: str = ""
    handler: str = ""
    lane: str = ""
    since: datetime | None = None
    until: datetime | None = None
    where: str = "live"
    raw: Mapping[str, str] = field(default_factory=dict)
    """The GET parameters it was read from (blank ones left out): its URL, its record."""

    @classmethod
    def parse(cls, params: Mapping[str, Any]) -> Query:
        """The query GET parameters ask for; InvalidOption saying what is wrong."""
        raw = {name: str(params.get(name, "")).strip() for name in FIELDS}
        raw = {name: value for name, value in raw.items() if value}
        for name, value in raw.items():
            _storable(value, name)
        terms, text = _terms(raw.get("q", ""))
        state = raw.get("state", "")
        if state and state not in State.values:
            raise InvalidOption(f"unknown state {state!r}: use one of {', '.join(State.values)}")
        where = raw.get("where", "live")
        if where not in WHERE:
            raise InvalidOption(f"search where? {where!r}: use live or history")
        try:
            queue = validate_queue(raw["queue"]) if raw.get("queue") else ""
            lane = validate_lane(raw["lane"]) if raw.get("lane") else ""
        except JobQueueError as exc:
            raise InvalidOption(str(exc)) from None
        handler = raw.get("handler", "")
        if len(handler) > MAX_TEXT:
            raise InvalidOption(f"a handler's name is at most {MAX_TEXT} characters")
        return cls(
            terms, text, queue, state, handler, lane, _time(raw, "since"), _time(raw, "until"), where, raw
        )

    @property
    def needs_payload(self) -> bool:
        return bool(self.terms or self.text or self.handler)

    def describe(self) -> str:
        """The filter in one line, for a confirmation, a log entry, a record."""
        return (
            " ".join(f"{name}={value}" if name != "q" else value for name, value in self.raw.items())
            or "(every job)"
        )

    def hidden_terms(self, keys: tuple[str | int, ...]) -> list[str]:
        """The terms whose path goes through a hidden key."""
        names = {key for key in keys if isinstance(key, str)}
        positions = {key for key in keys if isinstance(key, int)}
        return [
            str(term)
            for term in self.terms
            if (term.path[0] == "args" and len(term.path) > 1 and term.path[1] in positions)
            or any(isinstance(key, str) and key in names for key in term.path[1:])
        ]

    def masked(self, keys: tuple[str | int, ...], mask: str) -> Query:
        """This query with the value of each term through a hidden key shown as `mask`: how it
        reads to one who may not see hidden arguments (a record of a search made by one who may)."""
        refused = set(self.hidden_terms(keys))
        if not refused:
            return self
        shown = []
        for token in TOKEN.findall(self.raw.get("q", "")):
            found = PATH_TERM.fullmatch(token)
            if found and str(_term(found["path"], found["op"], found["value"], token)) in refused:
                token = f"{found['path']}{found['op']}{mask}"
            shown.append(token)
        return replace(self, raw={**self.raw, "q": " ".join(shown)})

    def matches(self, info: Any, states: frozenset[str] | None = None, shown_payload: Any = None) -> bool:
        """Whether a live job (a JobInfo, or what a search reads of its row: `search.Seen`)
        matches (and is in one of `states`, when given); `shown_payload`:
        its payload as the user may see it, which plain text and contains-terms look in."""
        if (
            (states is not None and info.state not in states)
            or (self.state and info.state != self.state)
            or (self.lane and (info.lane or "") != self.lane)
        ):
            return False
        when = info.enqueued_at
        if (self.since and (when is None or when < self.since)) or (
            self.until and (when is None or when >= self.until)
        ):
            return False
        payload = info.payload if isinstance(info.payload, dict) else {}
        if self.handler and payload.get("handler") != self.handler:
            return False
        shown = shown_payload if shown_payload is not None else payload
        if not all(term.matches(payload if term.op == "=" else shown) for term in self.terms):
            return False  # (text contained in a dict may be a hidden key's value: masked)
        return all(_text_matches(info, shown, word) for word in self.text)


def _text_matches(info: Any, payload: Any, word: str) -> bool:
    if word in (info.id, info.lane, info.unique_key):
        return True
    folded = word.casefold()
    handler = payload.get("handler") if isinstance(payload, dict) else None
    if isinstance(handler, str) and folded in handler.casefold():
        return True
    return isinstance(payload, dict) and any(
        name in payload and folded in as_text(payload[name]).casefold() for name in ("args", "kwargs")
    )


def _terms(q: str) -> tuple[tuple[Term, ...], tuple[str, ...]]:
    if q.count('"') % 2:
        raise InvalidOption(f"unbalanced double quote in {q[:80]!r}")
    tokens = TOKEN.findall(q)
    if len(tokens) > MAX_TERMS:
        raise InvalidOption(f"at most {MAX_TERMS} terms, got {len(tokens)}")
    terms, text = [], []
    for token in tokens:
        found = PATH_TERM.fullmatch(token)
        if found is None:
            word = _unquoted(token)
            if len(word) > MAX_TEXT:
                raise InvalidOption(f"a search text is at most {MAX_TEXT} characters")
            text.append(word)
            continue
        terms.append(_term(found["path"], found["op"], found["value"], token))
    for value in (*(term.value for term in terms), *text):
        _storable(value, "a search term")
    return tuple(terms), tuple(text)


def _storable(text: str, what: str) -> None:
    """InvalidOption unless `text` is text a database holds: no NUL (PostgreSQL's text holds
    none), no lone surrogate (a JSON escape such as "\\ud800": no UTF-8 encodes it)."""
    if "\x00" in text:
        raise InvalidOption(f"{what} holds a NUL character (\\x00 or \\u0000): a search cannot look for it")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidOption(
            f"{what} holds a lone surrogate (such as \\ud800): a search cannot look for it"
        ) from None


def _term(path_text: str, op: str, value_text: str, token: str) -> Term:
    parts = path_text.split(".")
    if len(parts) < 2 or len(parts) > MAX_DEPTH + 1 or not all(KEY.fullmatch(p) for p in parts[1:]):
        raise InvalidOption(
            f"malformed path in {token[:80]!r}: write args.<position> or kwargs.<key>, then "
            f"more .<key> or .<position> (up to {MAX_DEPTH}), each 1-100 letters, digits or _-:@$"
        )
    if parts[0] == "args" and not parts[1].isdecimal():
        raise InvalidOption(f"malformed path in {token[:80]!r}: args takes a position (args.0)")
    path = (parts[0], *(int(p) if p.isdecimal() else p for p in parts[1:]))
    if value_text.startswith('"') and op == "=":
        try:
            value = json.loads(value_text)
        except ValueError:
            raise InvalidOption(f"malformed quoted value in {token[:80]!r}") from None
        return Term(path, op, str(value))
    term = Term(path, op, _unquoted(value_text))
    if op == "=" and isinstance(term.values[0], (dict, list)):
        raise InvalidOption(
            f"{token[:80]!r}: compare a path's value with a number, text, true, "
            f"false or null (reach into a list or dict with a longer path)"
        )
    return term


def _unquoted(text: str) -> str:
    if len(text) >= 2 and text.startswith('"') and text.endswith('"'):
        try:
            return str(json.loads(text))
        except ValueError:
            return text[1:-1]
    return text


def _time(raw: Mapping[str, str], name: str) -> datetime | None:
    text = raw.get(name, "")
    if not text:
        return None
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise InvalidOption(
            f"{name} must be a date or time such as 2026-12-04 or 2026-12-04T19:30, got {text[:40]!r}"
        ) from None
    return when.replace(tzinfo=UTC) if when.tzinfo is None else when
