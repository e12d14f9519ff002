"""A django.tasks task in an app's `tasks` module that nothing else imports: a worker finds it
the first time a job names it (tests/api/test_django_tasks.py)."""

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the django-tasks backport
    from django_tasks import task  # type: ignore[no-redef]


@task
def shout(word: str) -> str:
    return word.upper()
