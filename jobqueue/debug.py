"""What Django's error reports show of secrets that hide in URLs.

Django's `SafeExceptionReporterFilter` hides a setting by its name (`…PASS…`, `…TOKEN…`, …): a
password inside a URL under another name (`JOBQUEUE["URL"]`, a cache's `LOCATION`, a broker URL)
is shown on the debug page and in the reports a site mails or logs. This filter hides the
credentials of every URL in the settings and in a frame's text variables too:

    DEFAULT_EXCEPTION_REPORTER_FILTER = "jobqueue.debug.SafeExceptionReporterFilter"
"""

from __future__ import annotations

import re
from typing import Any

from django.views import debug

CREDENTIALS = re.compile(r"(?P<scheme>\b[a-z][a-z0-9+.-]*://)[^\s/?#@]+@", re.IGNORECASE)
"""The user information of a URL (`user:password@`, `:password@`), after its scheme."""


def hide_credentials(text: str, substitute: str = debug.SafeExceptionReporterFilter.cleansed_substitute
                     ) -> str:
    """`text` with the credentials of every URL in it replaced: `redis://:pw@host` reads
    `redis://********************@host` (the host stays, to debug with)."""
    return CREDENTIALS.sub(lambda found: f"{found['scheme']}{substitute}@", text)


class SafeExceptionReporterFilter(debug.SafeExceptionReporterFilter):
    """Django's filter, with the credentials of URLs hidden as well: in every setting (at any
    depth: `cleanse_setting` recurses through this method), and in frame variables that are
    text (whether or not DEBUG is on)."""

    def cleanse_setting(self, key: Any, value: Any) -> Any:
        cleansed = super().cleanse_setting(key, value)
        return hide_credentials(cleansed, self.cleansed_substitute) if isinstance(cleansed, str) \
            else cleansed

    def get_traceback_frame_variables(self, request: Any, tb_frame: Any) -> Any:
        return [(name, hide_credentials(value, self.cleansed_substitute)
                 if isinstance(value, str) else value)
                for name, value in super().get_traceback_frame_variables(request, tb_frame)]
