from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from jobqueue.models import BulkOperation
from tests.console.test_search import row

pytestmark = pytest.mark.django_db(transaction=True)
LIVE = "/admin/jobqueue/job/live"


@pytest.mark.parametrize("url", [
    f"{LIVE}/bulk/99999999999999999999999/",
    f"{LIVE}/bulk/9223372036854775808/",
    f"{LIVE}/search/?q=args.99999999999999999999999%3D1&where=history",
    f"{LIVE}/search/?q=args.99999999999999999999999~1&where=history",
    f"{LIVE}/search/?q=kwargs.a.99999999999999999999999%3D1&where=history",
    f"{LIVE}/search/?q=args.99999999999999999999999%3D1&where=live",
    f"{LIVE}/search/?q=args.0%3D1&where=history&page=99999999999999999999",
    f"{LIVE}/search/?q=x&where=live&cursor=9.9.9999999999999999999.9",
    f"{LIVE}/search/?q=x&where=live&cursor=0.0.9999999999999999999.0",
    f"{LIVE}/search/?since=9999-12-31T23:59:59%2B14:00&where=history",
    f"{LIVE}/search/?since=0001-01-01T00:00-14:00&where=history",
    f"{LIVE}/search/?q=kwargs.%24%24%3D1&where=history",
    f"{LIVE}/search/?q=kwargs.a%3D%22%5Cud800%22&where=history",
    f"{LIVE}/search/?q=%00&where=history",
    f"{LIVE}/search/?handler=%00&where=history",
    f"{LIVE}/queues/default/?page=99999999999999999999&shard=999999&state=x&lane=%00",
    f"{LIVE}/flows/default/x/?page=99999999999999999999",
    f"{LIVE}/flows/default/JOB0000000000a/?page=99999999999999999999",
    f"{LIVE}/jobs/default/abc/",
    f"{LIVE}/find/?id=%00",
    f"{LIVE}/stuck/?pending_over=99999999999999999999999",
])
def test_probe(admin_client: Client, url: str) -> None:
    row("JOBhist0000001", 42, order={"id": 42})
    r = admin_client.get(url)
    assert r.status_code < 500, r.content.decode()[-3000:]


def test_probe_decide(admin_client: Client) -> None:
    r = admin_client.post(f"{LIVE}/bulk/99999999999999999999999/decide/", {"confirm": "yes"})
    assert r.status_code < 500


@pytest.mark.parametrize("url", [
    "/admin/jobqueue/job/?q=%00", "/admin/jobqueue/job/?lane=%00",
    "/admin/jobqueue/job/%00/change/",
    f"{LIVE}/search/?q=%22%5Cu0000%22&where=history",
    f"{LIVE}/search/?q=kwargs.a%3D%22%5Cu0000%22&where=history",
    f"{LIVE}/search/?q=kwargs.a~%22%5Cud800%22&where=history",
    f"{LIVE}/search/?q=%22%5Cud800%22&where=history",
    f"{LIVE}/search/?q=%22%5Cud800%22&where=live",
    f"{LIVE}/jobs/default/%00/", f"{LIVE}/flows/default/%00/",
    f"{LIVE}/queues/%00/",
])
def test_probe2(admin_client: Client, url: str) -> None:
    row("JOBhist0000001", 42, order={"id": 42})
    r = admin_client.get(url)
    assert r.status_code < 500, r.content.decode()[-3000:]
