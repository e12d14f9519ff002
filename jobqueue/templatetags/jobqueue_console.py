"""`{% console_url 'jobqueue_job' queue id %}`: a console link that stays in the mount that
served the page (the admin's, through `JobAdmin.get_urls()`, or a project's `console_urls`);
`{{ error|last_line }}`: a traceback's exception and message; `{{ ms|duration }}`: a time as read."""

from __future__ import annotations

from typing import Any

from django import template

from ..console import errors
from ..console.site import console_reverse

register = template.Library()


@register.simple_tag(takes_context=True)
def console_url(context: Any, name: str, *args: Any) -> str:
    return console_reverse(context["request"], name, *args)


@register.filter
def last_line(text: str | None) -> str:
    """`{{ job.last_error|last_line }}`: a traceback's exception and message (console/errors.py)."""
    return errors.last_line(text)


@register.filter
def duration(ms: float | None) -> str:
    """Milliseconds as an operator reads them (850 ms, 1.2 s, 3.4 min)."""
    from ..console.svg import duration as shown

    return shown(ms)
