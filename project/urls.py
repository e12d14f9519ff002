from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView

from jobqueue import metrics
from jobqueue.urls import console_urls
from project.demo import views as demo

urlpatterns = [
    path("", RedirectView.as_view(url="/admin/jobqueue/")),
    path("admin/jobqueue/", include(console_urls(admin.site))),
    path("admin/", admin.site.urls),
    path("metrics", metrics.view),
    path("codemojex/", demo.game),
]
