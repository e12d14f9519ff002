"""Settings of the bundled project: the demo, and the base the test settings build on.

Configuration comes from the environment (django-environ): VALKEY_URL and DATABASE_URL.
"""

from __future__ import annotations

from pathlib import Path

import environ

BASE_DIR = Path(__file__).resolve().parent.parent
env = environ.Env()

SECRET_KEY = env("DJANGO_SECRET_KEY", default="insecure-development-key-change-me")
DEBUG = env.bool("DJANGO_DEBUG", default=False)  # (`./dev.sh demo` turns it on)
ALLOWED_HOSTS = env.list("DJANGO_ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "[::1]"])
# Error reports (the debug page, mailed or logged reports) hide the password in VALKEY_URL too.
DEFAULT_EXCEPTION_REPORTER_FILTER = "jobqueue.debug.SafeExceptionReporterFilter"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "jobqueue",
    "project.demo",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "project.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]
WSGI_APPLICATION = "project.wsgi.application"

(BASE_DIR / "var").mkdir(exist_ok=True)
DATABASES = {"default": env.db("DATABASE_URL", default=f"sqlite:///{BASE_DIR / 'var' / 'db.sqlite3'}")}
if DATABASES["default"]["ENGINE"] == "django.db.backends.mysql":
    DATABASES["default"].setdefault("OPTIONS", {}).update({"charset": "utf8mb4"})
    DATABASES["default"].setdefault("TEST", {}).update({"CHARSET": "utf8mb4"})

JOBQUEUE = {
    "URL": env("VALKEY_URL", default="embedded"),
    "QUEUES": {
        "default": {},
        "emails": {"shards": 2, "max_attempts": 5, "lease": 30, "concurrency": 4},
        "cm": {},  # codemojex, the demo's game: a lane per player
    },
    # codemojex's board, kept every few seconds: a periodic job at work in the console
    "SCHEDULE": {"scoreboard": {"job": "project.demo.codemojex.scoreboard", "every": 5}},
}
TASKS = {"default": {"BACKEND": "jobqueue.tasks.ValkeyBackend"}}

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {"jobqueue": {"handlers": ["console"], "level": env("JOBQUEUE_LOG_LEVEL", default="INFO")}},
}
