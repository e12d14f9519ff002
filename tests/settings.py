"""Test settings: the project's, on the database DATABASE_URL names (MariaDB/MySQL, PostgreSQL
or SQLite), else on MariaDB when one answers on 127.0.0.1:3306, else SQLite.

`DATABASE_URL=postgres://postgres@127.0.0.1:5432/jobqueue` runs the tests on PostgreSQL (the test
database is `test_` + that name). CI always has MariaDB and PostgreSQL (.ci/run starts them); a
laptop without either still runs the suite and says so at the top of the run. Valkey servers are
started by fixtures (tests/conftest.py).
"""

import json
import os
import socket
from pathlib import Path

from project.settings import *  # noqa: F403
from project.settings import BASE_DIR, env

MYSQL_URL = os.environ.get("JOBQUEUE_TEST_MYSQL", "mysql://root@127.0.0.1:3306/jobqueue")


def _mysql_answers() -> bool:
    where = env.db_url_config(MYSQL_URL)
    try:
        with socket.create_connection((where["HOST"] or "127.0.0.1", int(where["PORT"] or 3306)), timeout=1):
            return True
    except OSError:
        return False


if "DATABASE_URL" in os.environ:
    DATABASES = {"default": env.db("DATABASE_URL")}
elif _mysql_answers():
    DATABASES = {"default": env.db_url_config(MYSQL_URL)}
else:
    DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3",
                             "NAME": str(BASE_DIR / "var" / "test.sqlite3"),
                             "TEST": {"NAME": str(BASE_DIR / "var" / "test.sqlite3")}}}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3" and "TEST" not in DATABASES["default"]:
    # A file, not Django's in-memory test database: worker subprocesses open the same one.
    _name = Path(DATABASES["default"]["NAME"])
    DATABASES["default"]["TEST"] = {"NAME": str(_name.with_name("test_" + _name.name))}
if DATABASES["default"]["ENGINE"] == "django.db.backends.mysql":
    DATABASES["default"].setdefault("OPTIONS", {}).update({"charset": "utf8mb4"})
    DATABASES["default"]["TEST"] = {"CHARSET": "utf8mb4"}

# A second alias on the same database (its own connections and transactions), for the tests of
# a transaction on another alias than `default`.
DATABASES["other"] = {**DATABASES["default"], "TEST": {**DATABASES["default"].get("TEST", {}),
                                                       "MIRROR": "default"}}

INSTALLED_APPS = [*INSTALLED_APPS, "tests.jobapp"]  # noqa: F405

# Fixtures fill in the URL of the Valkey they start (and pass it to worker subprocesses).
JOBQUEUE = {
    "URL": os.environ.get("VALKEY_URL", "redis://127.0.0.1:1/0"),
    "QUEUES": {"default": {}, "isolated": {"concurrency": 1}, "durable": {"durable": True},
               "limited": {"rate": "10/s"}, "elastic": {"shards": "auto", "max_shards": 4}},
}
if "JOBQUEUE_TEST_AUTO_SHARDS" in os.environ:  # the adaptive shards test's thresholds (JSON)
    JOBQUEUE["AUTO_SHARDS"] = json.loads(os.environ["JOBQUEUE_TEST_AUTO_SHARDS"])
if "JOBQUEUE_TEST_SCHEDULE" in os.environ:  # the schedule tests' workers (JSON of SCHEDULE)
    JOBQUEUE["SCHEDULE"] = json.loads(os.environ["JOBQUEUE_TEST_SCHEDULE"])
if "JOBQUEUE_TEST_QUEUES" in os.environ:  # more queues for a test's workers (JSON of QUEUES)
    JOBQUEUE["QUEUES"].update(json.loads(os.environ["JOBQUEUE_TEST_QUEUES"]))
if "JOBQUEUE_TEST_KEYS" in os.environ:  # the encryption tests' workers (JSON of ENCRYPTION_KEYS)
    JOBQUEUE["ENCRYPTION_KEYS"] = json.loads(os.environ["JOBQUEUE_TEST_KEYS"])
if "JOBQUEUE_TEST_EVENT_LOOP" in os.environ:
    JOBQUEUE["EVENT_LOOP"] = os.environ["JOBQUEUE_TEST_EVENT_LOOP"]
if "JOBQUEUE_TEST_SPANS" in os.environ:  # the tracing tests' workers write their spans there
    JOBQUEUE["TRACING"] = "tests.otel.to_file"
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
LOGGING = {"version": 1, "disable_existing_loggers": False}
