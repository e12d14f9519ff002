"""A job's error as an operator reads it first: the exception and its message, the last lines
of a Python traceback (`Traceback (most recent call last): …` ends with `ValueError: bad
input`), not its first. The job page keeps the whole text beside it (a <details>)."""

from __future__ import annotations

TRACEBACK = "Traceback (most recent call last):"


def last_line(text: str | None) -> str:
    """The exception line(s) ending a traceback, joined; any other text as it is. A traceback
    cut short at its end (no exception line left) is given whole."""
    if not text:
        return ""
    lines = text.strip().splitlines()
    if not any(line.startswith(TRACEBACK) for line in lines):
        return text.strip()
    frames = [i for i, line in enumerate(lines) if line.startswith((" ", "\t"))]
    start = frames[-1] + 1 if frames else 0
    message = [line for line in lines[start:] if line.strip()]
    return " ".join(message) if message else text.strip()
