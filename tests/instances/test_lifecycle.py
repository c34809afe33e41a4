"""Provisioning and teardown against the fake driver: the happy path, each way a start can fail, and
duplicates. The fake's JupyterLab is a real HTTP server on 127.0.0.1, so readiness is really waited for."""

import threading
import time

import pytest
from django.db import connection
from django.utils import timezone

from portal.accounts.models import User
from portal.credits.models import CreditAccount, LedgerEntry
from portal.instances import lifecycle, services
from portal.instances.models import Instance
from provisioning import scheduler
from provisioning.drivers import driver_for, fake
from provisioning.drivers.base import DriverError
from provisioning.models import GpuAllocation
from tests.conftest import give
from tests.support.drivers import start_on

pytestmark = pytest.mark.usefixtures("cloud")


def live_minors(instance) -> list[int]:
    return sorted(
        GpuAllocation.objects.filter(instance=instance, released_at__isnull=True).values_list(
            "gpu__render_minor", flat=True
        )
    )


def usage_entries(user):
    return LedgerEntry.objects.filter(account__user=user, kind=LedgerEntry.Kind.USAGE)


@pytest.fixture(autouse=True)
def ready_within_20_seconds(settings):
    settings.READY_TIMEOUT_SECONDS = 20


@pytest.fixture
def host(db):
    return fake.make_host("gpu-01", gpus=8)


@pytest.fixture
def cpu(db):
    return fake.make_image("cpu")


@pytest.fixture
def launch(alice, bob, cpu):
    give(alice, 25)
    give(bob, 25)

    def make(user=None, size="1x"):
        user = user or alice
        if size == "8x" and size not in user.extra_sizes:
            # 8x needs a bonus approval by default; an operator opens it to this user instead.
            user.extra_sizes = [*user.extra_sizes, size]
            user.save(update_fields=["extra_sizes"])
        return services.instance_launch(user=user, size=size, image_key="cpu")

    return make


def test_it_takes_a_launch_to_running_through_every_step(launch, host, cloud):
    instance = launch()

    assert lifecycle.instance_provision(instance_id=instance.id) == "running"

    instance.refresh_from_db()
    assert instance.state == Instance.State.RUNNING
    assert instance.step == Instance.Step.READY
    assert instance.host == host
    assert instance.ready_at is not None
    assert instance.metered_until == instance.ready_at
    assert instance.driver_state["endpoint"] == cloud.endpoint
    assert live_minors(instance) == [128]
    assert cloud.containers[str(instance.id)].render_minors == [128]
    assert [(e.state, e.step) for e in instance.events.all()] == [
        ("queued", "queued"),
        ("provisioning", "allocating"),
        ("provisioning", "starting"),
        ("provisioning", "waiting"),
        ("running", "ready"),
    ]
    assert not usage_entries(instance.user).exists()


def test_it_gives_an_8x_launch_all_eight_gpus_of_one_host(launch, host, cloud):
    instance = launch(size="8x")
    assert lifecycle.instance_provision(instance_id=instance.id) == "running"
    assert live_minors(instance) == [128, 136, 144, 152, 160, 168, 176, 184]


def test_it_waits_for_jupyterlab_to_accept_the_instances_own_token(launch, host, cloud, settings):
    settings.READY_TIMEOUT_SECONDS = 1
    instance = launch()
    # A container left from an earlier attempt answers only to another token: that is not ready.
    cloud.add_container(host=host, instance_id=instance.id, token="someone-elses-token")

    assert lifecycle.instance_provision(instance_id=instance.id) == "failed"
    assert "did not answer within 1 seconds" in Instance.objects.get(pk=instance.pk).failure_reason


def test_it_fails_a_permanent_driver_error_with_a_reason_frees_the_gpus_and_charges_nothing(
    launch, host, cloud
):
    instance = launch()
    balance = CreditAccount.objects.get(user=instance.user).balance_gpu_seconds
    cloud.behave(permanent_start_error="Image devcloud/cpu:test is not on this host.")

    assert lifecycle.instance_provision(instance_id=instance.id) == "failed"

    instance.refresh_from_db()
    assert instance.state == Instance.State.FAILED
    assert instance.failure_reason == (
        "The host could not start the CPU image: Image devcloud/cpu:test is not on this host. Nothing was charged. "
        "Try another image, or tell the operators if it keeps happening."
    )
    assert instance.stopped_at is not None
    assert live_minors(instance) == []
    assert str(instance.id) not in cloud.containers
    assert instance.charged_gpu_seconds == 0 and instance.metered_until is None
    assert CreditAccount.objects.get(user=instance.user).balance_gpu_seconds == balance
    assert instance.events.last().message == instance.failure_reason


def test_it_lets_a_transient_driver_error_through_for_the_task_to_retry(launch, host, cloud):
    instance = launch()
    cloud.behave(transient_start_failures=1)

    with pytest.raises(DriverError) as raised:
        lifecycle.instance_provision(instance_id=instance.id)
    assert raised.value.permanent is False
    assert Instance.objects.get(pk=instance.pk).state == Instance.State.PROVISIONING

    # The retry resumes the same instance, on the same GPUs.
    assert lifecycle.instance_provision(instance_id=instance.id, resume=True) == "running"
    assert live_minors(instance) == [128]
    assert cloud.count("start") == 2


def test_it_fails_an_instance_that_never_gets_ready_after_the_timeout(launch, host, cloud, settings):
    settings.READY_TIMEOUT_SECONDS = 1
    cloud.behave(never_ready=True)
    instance = launch()

    started = time.monotonic()
    assert lifecycle.instance_provision(instance_id=instance.id) == "failed"
    assert 1 <= time.monotonic() - started < 10

    instance.refresh_from_db()
    assert instance.state == Instance.State.FAILED
    assert instance.failure_reason.startswith(
        "JupyterLab did not answer within 1 seconds, so the launch was stopped."
    )
    assert "Nothing was charged" in instance.failure_reason
    assert str(instance.id) not in cloud.containers
    assert live_minors(instance) == []
    assert instance.ready_at is None and instance.charged_gpu_seconds == 0


def test_it_fails_fast_when_the_container_crashes_during_start(launch, host, cloud):
    cloud.behave(crash_on_start=True)
    instance = launch()

    started = time.monotonic()
    assert lifecycle.instance_provision(instance_id=instance.id) == "failed"
    assert time.monotonic() - started < 5  # not the 20 s ready timeout

    instance.refresh_from_db()
    assert instance.failure_reason.startswith(
        "The container exited with exit code 1 before JupyterLab answered."
    )
    assert live_minors(instance) == []


def test_it_answers_a_duplicate_delivery_with_a_no_op(launch, host, cloud):
    instance = launch()
    assert lifecycle.instance_provision(instance_id=instance.id) == "running"
    events = instance.events.count()

    assert lifecycle.instance_provision(instance_id=instance.id) == "skipped"
    assert lifecycle.instance_provision(instance_id=instance.id, resume=True) == "skipped"

    assert cloud.count("start") == 1
    assert len(cloud.containers) == 1
    assert instance.events.count() == events
    assert GpuAllocation.objects.filter(instance=instance).count() == 1


def test_it_does_not_provision_a_redelivered_message_it_was_not_told_to_resume(launch, host, cloud):
    instance = launch()
    Instance.objects.filter(pk=instance.pk).update(state=Instance.State.PROVISIONING)
    assert lifecycle.instance_provision(instance_id=instance.id) == "skipped"
    assert cloud.count("start") == 0


def test_it_resumes_a_provisioning_a_killed_worker_left_halfway(launch, host, cloud):
    instance = launch()
    # The worker claimed it, got GPUs and started the container, then died before waiting.
    Instance.objects.filter(pk=instance.pk).update(
        state=Instance.State.PROVISIONING, step=Instance.Step.STARTING
    )
    allocations = scheduler.allocate(instance_id=instance.id)
    instance.refresh_from_db()
    start_on(driver_for(host, "fake"), instance, [a.gpu for a in allocations])

    assert lifecycle.instance_provision(instance_id=instance.id, resume=True) == "running"
    assert len(cloud.containers) == 1
    assert live_minors(instance) == [128]


def test_it_skips_an_instance_stopped_before_its_task_ran(launch, host, cloud):
    instance = launch()
    services.instance_stop(user=instance.user, instance_id=instance.id)
    assert lifecycle.instance_provision(instance_id=instance.id) == "skipped"
    assert Instance.objects.get(pk=instance.pk).state == Instance.State.STOPPED
    assert cloud.count("start") == 0


def test_it_puts_a_launch_back_in_the_queue_when_no_gpus_are_free(launch, cloud, bob, db):
    fake.make_host("small", gpus=1)
    first = launch()
    second = launch(user=bob)
    assert lifecycle.instance_provision(instance_id=first.id) == "running"

    assert lifecycle.instance_provision(instance_id=second.id) == "queued"

    second.refresh_from_db()
    assert second.state == Instance.State.QUEUED
    assert second.host is None
    assert second.events.last().message == (
        "No GPUs are free right now: number 1 in the queue. It starts as soon as GPUs free up."
    )


def test_it_starts_queued_launches_in_order_when_gpus_free_up(launch, cloud, alice, bob, charlie, db):
    fake.make_host("small", gpus=1)
    running, waiting = launch(), launch(user=bob)
    lifecycle.instance_provision(instance_id=running.id)
    lifecycle.instance_provision(instance_id=waiting.id)
    dave = User.objects.create_user("dave@example.com", "pw-dave-012345", email_verified_at=timezone.now())
    give(dave, 25)
    later = launch(user=dave)

    # GPUs are busy, and an earlier launch waits: the later one queues behind it.
    assert lifecycle.instance_provision(instance_id=later.id) == "queued"
    assert later.events.last().message.startswith("Waiting for free GPUs behind earlier launches: number 2")

    services.instance_stop(user=alice, instance_id=running.id)
    # Teardown frees the GPU and hands it to the queue (tasks run inline in tests).
    assert lifecycle.instance_teardown(instance_id=running.id) == "stopped"

    assert Instance.objects.get(pk=waiting.pk).state == Instance.State.RUNNING
    assert Instance.objects.get(pk=later.pk).state == Instance.State.QUEUED


def test_start_queued_leaves_fresh_launches_to_their_own_task(launch, host, cloud):
    fresh = launch()
    assert lifecycle.start_queued() == 0
    assert Instance.objects.get(pk=fresh.pk).state == Instance.State.QUEUED

    # A launch whose message was lost is picked up once the grace period is over.
    later = timezone.now() + lifecycle.FRESH_LAUNCH_GRACE + timezone.timedelta(seconds=1)
    assert lifecycle.start_queued(now=later) == 1
    assert Instance.objects.get(pk=fresh.pk).state == Instance.State.RUNNING


def test_it_tears_down_a_stopped_instance_and_frees_its_gpus(launch, host, cloud):
    instance = launch()
    lifecycle.instance_provision(instance_id=instance.id)
    services.instance_stop(user=instance.user, instance_id=instance.id)

    assert lifecycle.instance_teardown(instance_id=instance.id) == "stopped"

    instance.refresh_from_db()
    assert instance.state == Instance.State.STOPPED
    assert instance.stopped_at is not None
    assert instance.stop_reason == "user"
    assert str(instance.id) not in cloud.containers
    assert live_minors(instance) == []
    assert lifecycle.instance_teardown(instance_id=instance.id) == "skipped"


def test_teardown_waits_for_an_unreachable_host_unless_forced(launch, host, cloud):
    instance = launch()
    lifecycle.instance_provision(instance_id=instance.id)
    services.instance_stop(user=instance.user, instance_id=instance.id)
    cloud.behave(engine_down=True)

    with pytest.raises(DriverError):
        lifecycle.instance_teardown(instance_id=instance.id)
    assert Instance.objects.get(pk=instance.pk).state == Instance.State.STOPPING
    assert live_minors(instance) == [128]

    assert lifecycle.instance_teardown(instance_id=instance.id, force=True) == "stopped"
    assert live_minors(instance) == []


@pytest.mark.django_db(transaction=True)
def test_it_abandons_a_start_the_owner_stopped_while_it_waited(settings, cloud):
    settings.READY_TIMEOUT_SECONDS = 20
    alice = User.objects.create_user("alice@example.com", "pw-alice-0123", email_verified_at=timezone.now())
    give(alice, 25)
    fake.make_host("gpu-01")
    fake.make_image("cpu")
    cloud.behave(never_ready=True)
    # Created directly (not launched): committed launches enqueue, and this test runs the task itself.
    instance = Instance.objects.create(
        user=alice, size="1x", image=fake.make_image("cpu2"), driver="fake", jupyter_token="t"
    )

    def stop_soon():
        while Instance.objects.get(pk=instance.pk).step != Instance.Step.WAITING:
            time.sleep(0.05)
        services.instance_stop(user=alice, instance_id=instance.id)
        connection.close()

    stopper = threading.Thread(target=stop_soon)
    stopper.start()
    started = time.monotonic()
    outcome = lifecycle.instance_provision(instance_id=instance.id)
    stopper.join(10)

    instance.refresh_from_db()
    assert outcome == "skipped", (instance.failure_reason, [e.message for e in instance.events.all()])
    assert time.monotonic() - started < 5
    instance.refresh_from_db()
    assert instance.state == Instance.State.STOPPED  # the stop's teardown ran inline
    assert str(instance.id) not in cloud.containers
    assert live_minors(instance) == []
    assert instance.charged_gpu_seconds == 0
