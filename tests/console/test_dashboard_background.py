"""The console shows whether the Celery workers answer and whether beat's tasks run on time."""

import os
import re
from datetime import timedelta

import pytest
from django.core.cache import cache
from django.utils import timezone

from portal.console.models import PeriodicTaskRun
from tests.support.worker import celery_publishing_to, celery_worker, redis_url, unique_queue

URL = "/console/"
OPS_REDIS_DB = int(os.environ.get("OPS_TEST_REDIS_DB", "13"))


def row(response, name):
    found = re.search(
        rf'data-testid="check-{re.escape(name)}">(.*?)</tr>', response.content.decode(), re.DOTALL
    )
    assert found, f"no row for {name}"
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", found.group(1))).strip()


@pytest.fixture(autouse=True)
def fresh_answers():
    cache.clear()
    yield
    cache.clear()


def test_it_shows_the_meter_tick_on_time_and_the_reconciler_late(olivia_client, settings):
    now = timezone.now()
    PeriodicTaskRun.objects.create(
        task_name="provisioning.meter_tick", last_succeeded_at=now - timedelta(seconds=50)
    )
    # Two periods and a bit: beat or every worker has stopped running it.
    PeriodicTaskRun.objects.create(
        task_name="provisioning.reconcile",
        last_succeeded_at=now - timedelta(seconds=2 * settings.RECONCILE_SECONDS + 5),
    )

    response = olivia_client.get(URL)

    assert "ok" in row(response, "beat:provisioning.meter_tick")
    assert "late" in row(response, "beat:provisioning.reconcile")
    assert "required" in row(response, "beat:provisioning.reconcile")
    assert "needs attention" in response.content.decode()


def test_it_says_when_a_beat_task_has_never_run(olivia_client):
    response = olivia_client.get(URL)

    assert "has not run yet" in row(response, "beat:provisioning.meter_tick")


def test_it_shows_the_failure_of_the_last_run(olivia_client, monkeypatch):
    from django.db import OperationalError

    from portal.celery import app
    from portal.instances import lifecycle

    app.tasks["provisioning.meter_tick"].apply()

    def database_gone(*args, **kwargs):
        raise OperationalError("connection to server at 10.1.2.3 failed")

    monkeypatch.setattr(lifecycle, "meter_tick", database_gone)
    propagates = app.conf.task_eager_propagates
    app.conf.task_eager_propagates = False
    try:
        app.tasks["provisioning.meter_tick"].apply()
    finally:
        app.conf.task_eager_propagates = propagates

    shown = row(olivia_client.get(URL), "beat:provisioning.meter_tick")
    # It ran well a moment ago, so it is not late yet; but its last run failed, and the page says how.
    assert "failed with OperationalError" in shown
    assert "10.1.2.3" not in shown


def test_it_is_for_operators_only(client, alice):
    client.force_login(alice)

    assert client.get(URL).status_code == 403


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_it_shows_whether_a_worker_answers_on_the_provisioning_queue(olivia, settings):
    from django.test import Client

    browser = Client()
    browser.force_login(olivia)
    default, provisioning = unique_queue("default"), unique_queue("provisioning")
    settings.CELERY_TASK_DEFAULT_QUEUE = default
    settings.CELERY_PROVISIONING_QUEUE = provisioning
    broker = redis_url(OPS_REDIS_DB)
    with celery_publishing_to(broker_url=broker, queue=default):
        assert "no worker on queue" in row(browser.get(URL), f"worker:{provisioning}")

        cache.clear()
        with celery_worker(queues=[provisioning], broker_url=broker):
            answered = row(browser.get(URL), f"worker:{provisioning}")
        assert "ok" in answered and f"{provisioning}@" in answered
        # The default queue has nobody on it in this test.
        assert "failing" in row(browser.get(URL), f"worker:{default}")
