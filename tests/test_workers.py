"""The Celery layout of portal/workers.py: launches go to the provisioning queue, served by a thread-pool
worker; metering, stops and emails stay on the default queue. `make run` and the deploy kit start the
commands `portal.workers.command` builds."""

import os
import uuid

import pytest
import redis

from portal.workers import command
from tests.support.worker import celery_publishing_to, redis_url, unique_queue

OPS_REDIS_DB = int(os.environ.get("OPS_TEST_REDIS_DB", "13"))


@pytest.fixture
def queues(settings):
    """A default and a provisioning queue of this test's own, published to on a real Redis."""
    default, provisioning = unique_queue("default"), unique_queue("provisioning")
    settings.CELERY_PROVISIONING_QUEUE = provisioning
    settings.CELERY_TASK_ALWAYS_EAGER = False
    broker = redis_url(OPS_REDIS_DB)
    client = redis.Redis.from_url(broker)
    with celery_publishing_to(broker_url=broker, queue=default) as app:
        yield app, client, default, provisioning
    client.delete(default, provisioning)
    client.close()


def test_it_sends_launches_to_the_provisioning_queue(queues):
    app, client, default, provisioning = queues

    # By name, as the portal and beat publish them (the routes apply to every publish).
    app.send_task("provisioning.provision_instance", kwargs={"instance_id": str(uuid.uuid4())})

    assert client.llen(provisioning) == 1
    assert client.llen(default) == 0


@pytest.mark.parametrize(
    ("task_name", "kwargs"),
    [
        ("provisioning.meter_tick", {}),
        ("provisioning.teardown_instance", {"instance_id": str(uuid.uuid4())}),
        ("provisioning.reconcile", {}),
    ],
)
def test_it_keeps_metering_and_stops_on_the_default_queue(queues, task_name, kwargs):
    app, client, default, provisioning = queues

    app.send_task(task_name, kwargs=kwargs)

    assert client.llen(default) == 1
    assert client.llen(provisioning) == 0


def test_it_serves_launches_with_a_thread_pool_sized_for_waiting(settings):
    settings.CELERY_PROVISIONING_QUEUE = "provisioning"

    argv = command("provisioning", python="python", environ={})

    assert argv[argv.index("-Q") + 1] == "provisioning"
    assert argv[argv.index("-P") + 1] == "threads"
    assert int(argv[argv.index("-c") + 1]) >= 30, "a class of 30 launching at once waits in parallel"


def test_it_takes_the_concurrency_from_the_environment(settings):
    settings.CELERY_PROVISIONING_QUEUE = "provisioning"

    argv = command("provisioning", python="python", environ={"DEVCLOUD_PROVISIONING_CONCURRENCY": "48"})

    assert argv[argv.index("-c") + 1] == "48"


def test_it_runs_the_default_worker_on_the_default_queue_with_time_limits(settings):
    settings.CELERY_TASK_DEFAULT_QUEUE = "devcloud-x"

    argv = command("default", python="python", environ={})

    assert argv[argv.index("-Q") + 1] == "devcloud-x"
    # prefork is the pool that enforces the time limits image builds rely on.
    assert argv[argv.index("-P") + 1] == "prefork"
