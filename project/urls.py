from django.contrib import admin
from django.urls import path
from django.views.generic import RedirectView

from jobqueue import metrics
from project.demo import views as demo

urlpatterns = [
    path("", RedirectView.as_view(pattern_name="admin:jobqueue_dashboard")),
    path("admin/", admin.site.urls),
    path("metrics", metrics.view),
    path("codemojex/", demo.game),
]
