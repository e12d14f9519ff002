"""Where the operator console is mounted.

With `jobqueue` in `INSTALLED_APPS` and `admin.site.urls` in the project's URLconf, nothing more
is needed: `JobAdmin.get_urls()` mounts the console at `admin/jobqueue/job/live/`. A project that
wants it elsewhere (or on another admin site) can still include it itself:

    urlpatterns = [
        path("ops/jobs/", include(console_urls(admin.site))),
        path("admin/", admin.site.urls),
    ]

Pages link within the mount that served them (`console_reverse`).
"""

from __future__ import annotations

from typing import Any

from django.contrib.admin import AdminSite
from django.http import HttpRequest
from django.urls import reverse


def console_urls(site: AdminSite) -> list[Any]:
    from .views import Console

    return Console(site).urls()


def console_reverse(request: HttpRequest, name: str, *args: Any) -> str:
    """`reverse(name)` in the URL namespace of the console page being served: `admin:` when the
    admin mounted it, none (or the project's own) when `console_urls` did."""
    match = getattr(request, "resolver_match", None)
    namespace = match.namespace if match is not None else ""
    return reverse(f"{namespace}:{name}" if namespace else name, args=args)
