"""A project that also mounts the console itself, at a path of its own (`console_urls`)."""

from django.contrib import admin
from django.urls import include, path

from jobqueue.urls import console_urls

urlpatterns = [
    path("ops/jobs/", include(console_urls(admin.site))),
    path("admin/", admin.site.urls),
]
