from django.apps import AppConfig


class JobAppConfig(AppConfig):
    name = "tests.jobapp"
    label = "jobapp"
