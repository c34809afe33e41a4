"""The Celery tasks: stable names, transient errors retried with bounded backoff, permanent ones not,
duplicates harmless. Tasks run eagerly here, and an eager retry runs again inline at once (a worker
would wait for the countdown). Tests marked slow elsewhere use a real worker."""

import uuid

import pytest
from django.conf import settings

# A worker autodiscovers each app's tasks; beat also publishes provisioning's, so import them here.
import provisioning.tasks  # noqa: F401
from portal.celery import app
from portal.credits import services as credits
from portal.credits.models import CreditAccount
from portal.instances import services, tasks
from portal.instances.models import Instance
from provisioning.drivers import fake
from provisioning.models import GpuAllocation

pytestmark = pytest.mark.usefixtures("cloud")

HOUR = 3600


@pytest.fixture(autouse=True)
def eager_retries():
    # With eager propagation on (the test settings), Celery raises an eager task's Retry to the caller
    # instead of running the retry; off, apply() replays each retry inline.
    saved = app.conf.task_eager_propagates
    app.conf.task_eager_propagates = False
    yield
    app.conf.task_eager_propagates = saved


@pytest.fixture
def launched(alice, db):
    credits.credits_adjust(
        user=alice, gpu_seconds=25 * HOUR, reason="Test", actor=None, idempotency_key=str(uuid.uuid4())
    )
    fake.make_host("gpu-01")
    fake.make_image("cpu")
    return services.instance_launch(user=alice, size="1x", image_key="cpu")


def test_every_task_has_its_stable_name_and_acks_late():
    for name in (
        "provisioning.provision_instance",
        "provisioning.teardown_instance",
        "provisioning.meter_tick",
        "provisioning.reconcile",
        "provisioning.start_queued",
    ):
        assert name in app.tasks
        assert app.tasks[name].acks_late is True
    # Every instance task beat publishes is known under its old name, now that portal.instances declares it.
    beat = {entry["task"] for entry in settings.CELERY_BEAT_SCHEDULE.values()}
    assert {name for name in beat if name.startswith("provisioning.")} <= set(app.tasks)


def test_beat_runs_the_meter_tick_and_the_reconciler_every_minute():
    schedule = {entry["task"]: entry["schedule"] for entry in settings.CELERY_BEAT_SCHEDULE.values()}
    assert schedule["provisioning.meter_tick"] == settings.METER_TICK_SECONDS == 60
    assert schedule["provisioning.reconcile"] == settings.RECONCILE_SECONDS == 60


def test_it_retries_a_transient_error_and_then_runs(launched, cloud):
    cloud.behave(transient_start_failures=2)

    outcome = tasks.provision_instance.apply(kwargs={"instance_id": str(launched.id)})

    assert outcome.get() == "running"
    assert cloud.count("start") == 3
    assert Instance.objects.get(pk=launched.pk).state == Instance.State.RUNNING


def test_it_gives_up_on_an_unreachable_host_with_a_reason_and_no_charge(launched, cloud):
    cloud.behave(engine_down=True)
    balance = CreditAccount.objects.get(user=launched.user).balance_gpu_seconds

    outcome = tasks.provision_instance.apply(kwargs={"instance_id": str(launched.id)})

    assert outcome.get() == "failed"
    assert cloud.count("start") == tasks.MAX_RETRIES + 1
    launched.refresh_from_db()
    assert launched.state == Instance.State.FAILED
    assert launched.failure_reason.startswith("The GPU host did not answer (Cannot reach the Docker engine")
    assert "Nothing was charged" in launched.failure_reason
    assert not GpuAllocation.objects.filter(instance=launched, released_at__isnull=True).exists()
    assert CreditAccount.objects.get(user=launched.user).balance_gpu_seconds == balance


def test_it_does_not_retry_a_permanent_error(launched, cloud):
    cloud.behave(permanent_start_error="No such image.")
    assert tasks.provision_instance.apply(kwargs={"instance_id": str(launched.id)}).get() == "failed"
    assert cloud.count("start") == 1


def test_a_duplicate_delivery_is_a_no_op(launched, cloud):
    first = tasks.provision_instance.apply(kwargs={"instance_id": str(launched.id)})
    second = tasks.provision_instance.apply(kwargs={"instance_id": str(launched.id)})
    assert (first.get(), second.get()) == ("running", "skipped")
    assert cloud.count("start") == 1


def test_retry_waits_grow_but_stay_far_below_the_broker_visibility_timeout():
    visibility = settings.CELERY_BROKER_TRANSPORT_OPTIONS["visibility_timeout"]
    delays = [tasks.retry_delay(retries) for retries in range(tasks.MAX_RETRIES + 5)]
    assert delays[0] < delays[1] < delays[2]
    assert max(delays) <= tasks.MAX_RETRY_DELAY_SECONDS + 1 < visibility


def test_teardown_retries_then_leaves_it_to_the_reconciler(launched, cloud):
    tasks.provision_instance.apply(kwargs={"instance_id": str(launched.id)})
    services.instance_stop(user=launched.user, instance_id=launched.id)
    cloud.behave(engine_down=True)

    assert tasks.teardown_instance.apply(kwargs={"instance_id": str(launched.id)}).get() == "deferred"
    assert cloud.count("stop") == tasks.MAX_RETRIES + 1
    assert Instance.objects.get(pk=launched.pk).state == Instance.State.STOPPING

    assert (
        tasks.teardown_instance.apply(kwargs={"instance_id": str(launched.id), "force": True}).get()
        == "stopped"
    )


def test_the_periodic_tasks_run(launched):
    assert tasks.start_queued.apply().get() == 0
    assert tasks.meter_tick.apply().get() == {"instances_charged": 0, "gpu_seconds": 0, "stopping": 0}
    assert tasks.reconcile.apply().get()["hosts_checked"] == 1
