"""A module that no payload may make a worker import (tests/worker/test_hostile.py): importing it
leaves a mark, then fails as a misconfigured module does."""

import os

from django.core.exceptions import ImproperlyConfigured

os.environ["JOBQUEUE_TEST_SIDEFX"] = "imported"
raise ImproperlyConfigured("tests.jobapp.sidefx was imported because a payload named it")
