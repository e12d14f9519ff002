"""URLs of the operator console, mounted inside the admin:

    urlpatterns = [
        path("admin/jobqueue/", include(console_urls(admin.site))),
        path("admin/", admin.site.urls),
    ]
"""

from __future__ import annotations

from typing import Any

from django.contrib.admin import AdminSite


def console_urls(site: AdminSite) -> list[Any]:
    from .views import Console

    return Console(site).urls()
