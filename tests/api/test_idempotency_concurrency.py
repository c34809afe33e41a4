"""Two requests with the same Idempotency-Key at the same moment (a client that retried before the first
answer came back) launch one instance: the second waits on the key the first holds, then answers with the
first one's instance."""

import threading
import time

import pytest
from django.db import connection

from portal.api import services
from portal.instances.models import Instance
from tests.conftest import give

from .conftest import token_for

URL = "/api/v1/instances"


@pytest.mark.django_db(transaction=True)
def test_two_concurrent_requests_with_one_key_launch_once(alice, cpu, monkeypatch):
    give(alice, 25)
    _, api = token_for(alice)
    real_launch = services.instance_services.instance_launch

    def slow_launch(**kwargs):
        # The first request holds its key (uncommitted) long enough for the second to arrive.
        instance = real_launch(**kwargs)
        time.sleep(0.5)
        return instance

    monkeypatch.setattr(services.instance_services, "instance_launch", slow_launch)
    answers, start = [], threading.Barrier(2)

    def post():
        try:
            start.wait()
            answers.append(
                api.post(URL, {"size": "1x", "image": "cpu"}, headers={"Idempotency-Key": "one-launch"})
            )
        finally:
            connection.close()

    threads = [threading.Thread(target=post) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    assert sorted(answer.status_code for answer in answers) == [200, 201]
    assert len({answer.json()["id"] for answer in answers}) == 1
    assert Instance.objects.filter(user=alice).count() == 1
