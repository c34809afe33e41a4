"""An instance's log is read by a worker, never by the web process (portal/instances/logs.py): what a
page or the API says when no worker answers or the task queue is down. The production smoke test
(tests/deploy/test_production_stack.py) reads a real log this way with the web process cut off from the
engine."""

import json
import uuid

import pytest
import redis
from celery.result import denied_join_result

from portal.credits import services as credits
from portal.instances import lifecycle, logs, services
from portal.lib import worker_calls
from provisioning.drivers import fake
from tests.support.worker import celery_publishing_to, redis_url, unique_queue

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("cloud")]


@pytest.fixture
def running(alice):
    fake.make_host("gpu-01")
    fake.make_image("cpu", name="CPU JupyterLab")
    credits.credits_adjust(user=alice, gpu_seconds=3600, reason="Test", actor=None, idempotency_key=str(uuid.uuid4()))
    instance = services.instance_launch(user=alice, size="1x", image_key="cpu")
    assert lifecycle.instance_provision(instance_id=instance.id) == "running"
    instance.refresh_from_db()
    return instance


def test_without_a_worker_the_page_says_none_read_the_log_and_what_to_check(running, monkeypatch):
    monkeypatch.setattr(logs, "REPLY_SECONDS", 1)
    # A queue no worker listens on.
    with celery_publishing_to(broker_url=redis_url(12), queue=unique_queue("logs-nobody")):
        lines, note = logs.log_lines(running, lines=10)

    assert lines == []
    assert "No worker read the log within 1 s" in note and "workers run" in note


def test_with_the_task_queue_down_the_page_says_so(running):
    with celery_publishing_to(broker_url="redis://127.0.0.1:1/0", queue=unique_queue("logs-down")):
        lines, note = logs.log_lines(running, lines=10)

    assert lines == []
    assert "the task queue does not answer" in note


def test_the_worker_answers_on_the_reply_list_the_page_waits_on(settings, running):
    reply = f"test:log-reply:{running.id}"

    logs.log_reply(str(running.id), 10, reply)
    client = redis.Redis.from_url(settings.REDIS_URL)
    found = json.loads(client.lpop(reply))
    assert found == dict(zip(("lines", "note"), logs.log_lines_read(running, lines=10), strict=True))
    assert client.ttl(reply) in (-2, *range(1, worker_calls.REPLY_KEEP_SECONDS + 1))


def test_the_log_reads_while_another_thread_runs_a_task_eagerly(running):
    # A portal without workers runs tasks in-process; while one runs, Celery flags the whole process as
    # "inside a task", and a page served meanwhile on another thread must still get its answer.
    with denied_join_result():
        lines, note = logs.log_lines(running, lines=10)

    assert (lines, note) == logs.log_lines_read(running, lines=10)
