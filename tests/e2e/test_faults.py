"""Faults, for real: a worker SIGKILLed at each step of provisioning, a Docker engine that goes away mid-launch,
Redis down or restarting, and a task delivered twice. After each, there is one container or none per
instance, the GPUs the database hands out match the containers, and nothing is charged twice (or at all,
for a launch that never turned ready).

Workers are stopped at measured moments, never through hooks in the product: the test watches the
instance's row and the engine, and where a step is too short to catch it holds a PostgreSQL row lock the
worker needs (so it waits exactly there), kills the worker's process group, then lets go.
"""

from contextlib import contextmanager
from datetime import timedelta

import psycopg
import pytest
from django.conf import settings
from django.urls import reverse
from django.utils import timezone

from portal.credits.models import LedgerEntry
from portal.credits.selectors import balance_for
from portal.instances import lifecycle, services
from portal.instances.models import Instance
from portal.instances.tasks import provision_instance
from provisioning.models import GpuAllocation
from tests.conftest import give
from tests.support.worker import current_database_url

from .conftest import Cloud, publishing
from .helpers import (
    EngineProxy,
    ThrowawayRedis,
    assert_consistent,
    containers_of,
    live_minors,
    register_host,
    state_of,
    usage_charged,
    wait_for,
    wait_for_gpus_released,
    wait_for_state,
    wait_until_ready_for,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(120, func_only=True),
]


@contextmanager
def row_lock(sql: str, *params):
    """Hold the row lock `sql` takes, from a connection of its own, until the block ends (then roll back)."""
    connection = psycopg.connect(current_database_url())
    try:
        connection.execute(sql, params)
        yield connection
    finally:
        connection.rollback()
        connection.close()


def fresh_activity(connection):
    # Inside a transaction PostgreSQL answers pg_stat_activity from a snapshot taken at its first read.
    connection.execute("SELECT pg_stat_clear_snapshot()")


def someone_waits_on(connection) -> bool:
    """Whether another backend (the worker's) is blocked by a lock that `connection` holds."""
    fresh_activity(connection)
    row = connection.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))",
        (connection.info.backend_pid,),
    ).fetchone()
    return row[0] > 0


def blocked_backends(connection) -> int:
    """How many backends wait on a lock (on ours, or on one held by a backend waiting on ours)."""
    fresh_activity(connection)
    return connection.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND cardinality(pg_blocking_pids(pid)) > 0"
    ).fetchone()[0]


def provision_outcomes(worker) -> list[str]:
    """What each provision_instance run in `worker` returned ("running", "skipped", ...), from its log."""
    return [
        line.rsplit(": ", 1)[-1].strip("'")
        for line in worker.log().splitlines()
        if "provisioning.provision_instance[" in line and "succeeded in" in line
    ]


def at_step(instance_id, step: str):
    return lambda: Instance.objects.filter(pk=instance_id, step=step).exists()


def kill_worker_at(step: str, worker, instance_id) -> None:
    """SIGKILL the worker while it provisions `instance_id` at `step` ("starting" or "waiting"; for
    "allocating", too short to catch, the test holds the host's row lock so the worker waits there).

    starting:   the container is up on the engine, but the worker waits (on the instance's row, which we
                lock) to record it: the moment a crash leaves the most behind.
    waiting:    the worker is polling JupyterLab, which takes a second or two to answer.
    """
    wait_for(at_step(instance_id, step), timeout=60, what=f"the worker to reach {step}", interval=0.005)
    if step == "waiting":
        worker.kill()
        return
    with row_lock(
        "SELECT id FROM instances_instance WHERE id = %s FOR NO KEY UPDATE", str(instance_id)
    ) as locked:
        wait_for(lambda: containers_of(instance_id), timeout=30, what="the container to be created")
        wait_for(lambda: someone_waits_on(locked), timeout=30, what="the worker to wait on the instance row")
        worker.kill()


def assert_never_charged_twice(instance: Instance, stop_asked_by, gpus: int) -> None:
    """The ledger charged the instance at most GPUs × the seconds from ready to the stop request."""
    charged = usage_charged(instance.id)
    assert charged == instance.charged_gpu_seconds
    if instance.ready_at is None:
        assert charged == 0
    else:
        assert charged <= gpus * (stop_asked_by - instance.ready_at).total_seconds()


def stop_and_wait(user, instance_id) -> tuple[Instance, object]:
    """Stops the instance as its owner does and waits for the teardown. Returns it and a moment no earlier
    than the stop request (billing ends at the request)."""
    services.instance_stop(user=user, instance_id=instance_id)
    asked_by = timezone.now()
    return wait_for_state(instance_id, Instance.State.STOPPED, timeout=60), asked_by


@pytest.fixture
def host(db, e2e_dev_root):
    return register_host("gpu-e2e-faults", e2e_dev_root.path)


@pytest.fixture
def funded_alice(alice):
    give(alice, 25)
    return alice


# --- A worker killed at each step ----------------------------------------------------------------------


@pytest.mark.parametrize("step", ["allocating", "starting", "waiting"])
def test_it_finishes_a_launch_whose_worker_was_killed_with_one_container_and_one_charge(
    step, funded_alice, host, e2e_cloud, e2e_images
):
    balance_before = balance_for(funded_alice)
    with e2e_cloud.worker(quick_redelivery=True) as doomed:
        if step == "allocating":
            with row_lock("SELECT id FROM provisioning_gpuhost WHERE id = %s FOR UPDATE", host.id) as locked:
                instance = services.instance_launch(user=funded_alice, size="1x", image_key="cpu")
                wait_for(
                    at_step(instance.id, "allocating"), timeout=60, what="the worker to claim the launch"
                )
                wait_for(
                    lambda: someone_waits_on(locked), timeout=30, what="the worker to wait on the host row"
                )
                doomed.kill()
        else:
            instance = services.instance_launch(user=funded_alice, size="1x", image_key="cpu")
            kill_worker_at(step, doomed, instance.id)

    killed = state_of(instance.id)
    assert (killed.state, killed.step) == (Instance.State.PROVISIONING, step)
    assert len(containers_of(instance.id)) == (0 if step == "allocating" else 1)

    # acks_late: the message was never acknowledged, so the next worker gets it again (redelivered).
    with e2e_cloud.worker(quick_redelivery=True) as successor:
        running = wait_for_state(instance.id, Instance.State.RUNNING, Instance.State.FAILED, timeout=60)
        assert running.state == Instance.State.RUNNING, running.failure_reason
        assert_consistent(instance.id)
        assert len(containers_of(instance.id)) == 1 and len(live_minors(instance.id)) == 1
        # Beat's reconciler finds nothing left to repair.
        report = lifecycle.reconcile()
        assert (report.orphans_removed, report.vanished_failed, report.allocations_freed) == (0, 0, 0)
        assert (report.provisioning_resumed, report.provisioning_failed) == (0, 0)
        assert GpuAllocation.objects.filter(instance_id=instance.id).count() == 1
        # A beat tick charges the running instance; the stop must then charge only the rest.
        wait_until_ready_for(running, 1.5)
        assert lifecycle.meter_tick().gpu_seconds >= 1

        # Nothing but the redelivered message could have finished it: no reconciler ran before.
        assert "provisioning.provision_instance" in successor.log()
        stopped, asked_at = stop_and_wait(funded_alice, instance.id)

    assert_consistent(instance.id)
    assert_never_charged_twice(stopped, asked_at, gpus=1)
    assert balance_for(funded_alice) == balance_before - stopped.charged_gpu_seconds


def test_it_finishes_a_launch_whose_message_died_with_its_worker_through_the_reconciler(
    funded_alice, host, e2e_cloud, e2e_images
):
    # The default hour-long visibility timeout: the killed worker's message is not redelivered within
    # the test, so only the reconciler's repair of instances stuck in provisioning can finish it.
    with e2e_cloud.worker() as doomed:
        instance = services.instance_launch(user=funded_alice, size="1x", image_key="cpu")
        kill_worker_at("starting", doomed, instance.id)

    with e2e_cloud.worker():
        # As beat's reconcile would run once STUCK_TRANSITION_SECONDS have passed.
        later = timezone.now() + timedelta(seconds=settings.STUCK_TRANSITION_SECONDS + 1)
        report = lifecycle.reconcile(later)
        assert (report.provisioning_resumed, report.orphans_removed) == (1, 0)

        running = wait_for_state(instance.id, Instance.State.RUNNING, Instance.State.FAILED, timeout=60)
        assert running.state == Instance.State.RUNNING, running.failure_reason
        assert_consistent(instance.id)
        assert len(containers_of(instance.id)) == 1
        stopped, asked_at = stop_and_wait(funded_alice, instance.id)

    assert_consistent(instance.id)
    assert_never_charged_twice(stopped, asked_at, gpus=1)


# --- The Docker engine goes away ------------------------------------------------------------------------


def test_it_fails_a_launch_with_a_reason_and_no_charge_when_the_docker_engine_stops(
    funded_alice, e2e_dev_root, e2e_cloud, e2e_images
):
    engine = EngineProxy().start()
    try:
        host = register_host("gpu-e2e-tcp", e2e_dev_root.path, docker_url=engine.url)
        balance_before = balance_for(funded_alice)
        # Retries back off within a quarter of the (short) visibility timeout, so they run out quickly.
        with e2e_cloud.worker(quick_redelivery=True) as worker:
            instance = services.instance_launch(user=funded_alice, size="1x", image_key="cpu")
            wait_for(
                at_step(instance.id, "starting"),
                timeout=60,
                what="the worker to start the container",
                interval=0.005,
            )
            engine.kill()
            failed = wait_for_state(instance.id, Instance.State.FAILED, Instance.State.RUNNING, timeout=90)

            assert failed.state == Instance.State.FAILED, worker.log()[-3000:]
            assert (
                f"The Docker engine of host {host.name} ({engine.url}) cannot be reached"
                in failed.failure_reason
            )
            assert "Nothing was charged" in failed.failure_reason
            wait_for_gpus_released(instance.id)
            assert not GpuAllocation.objects.filter(released_at__isnull=True).exists()
            assert usage_charged(instance.id) == 0 and failed.ready_at is None
            assert balance_for(funded_alice) == balance_before

            # The engine comes back: the reconciler removes whatever the failed launch left on it.
            engine.start()
            lifecycle.reconcile()
            assert containers_of(instance.id) == []
    finally:
        engine.kill()


# --- Redis ------------------------------------------------------------------------------------------------


def test_it_renders_pages_and_says_launching_is_unavailable_while_redis_is_down(
    client, funded_alice, host, e2e_portal, e2e_images
):
    client.force_login(funded_alice)
    balance_before = balance_for(funded_alice)

    with publishing("redis://127.0.0.1:1/0", "e2e-nobody-listens"):
        for page in ("credits:dashboard", "instances:list", "credits:bonus"):
            response = client.get(reverse(page))
            assert response.status_code == 200, page
        launch = client.post(reverse("instances:launch"), {"size": "1x", "image": "cpu"})

    assert launch.status_code == 503
    assert "Launching is unavailable right now, nothing was charged." in launch.content.decode()
    assert not Instance.objects.filter(state__in=Instance.LIVE_STATES).exists()
    assert not GpuAllocation.objects.exists()
    assert balance_for(funded_alice) == balance_before
    assert not LedgerEntry.objects.filter(kind=LedgerEntry.Kind.USAGE).exists()
    # The launch that could not be queued says so on its own page, too.
    refused = Instance.objects.get(user=funded_alice)
    status = client.get(reverse("instances:status", args=[refused.id])).json()
    assert (status["state"], status["is_final"]) == ("failed", True)
    assert "Nothing was charged" in status["failure_reason"]


def test_it_completes_a_launch_while_redis_restarts_under_the_worker(
    funded_alice, host, e2e_portal, e2e_images
):
    # Restarted without persistence: whatever Redis held (the unacknowledged provision message) is lost.
    broker = ThrowawayRedis().start()
    cloud = Cloud(e2e_portal, broker.url)
    try:
        with publishing(broker.url, cloud.queue), cloud.worker() as worker:
            instance = services.instance_launch(user=funded_alice, size="1x", image_key="cpu")
            wait_for(
                at_step(instance.id, "waiting"),
                timeout=60,
                what="the worker to wait for JupyterLab",
                interval=0.005,
            )
            broker.restart()

            # Waiting for JupyterLab needs no broker: the launch completes.
            running = wait_for_state(instance.id, Instance.State.RUNNING, Instance.State.FAILED, timeout=60)
            assert running.state == Instance.State.RUNNING, running.failure_reason
            # Nothing is left for the reconciler, even once a stuck launch would be repaired.
            report = lifecycle.reconcile(
                timezone.now() + timedelta(seconds=settings.STUCK_TRANSITION_SECONDS + 1)
            )
            assert (report.provisioning_resumed, report.provisioning_failed, report.orphans_removed) == (
                0,
                0,
                0,
            )
            assert_consistent(instance.id)

            # Both sides reconnected: the web side publishes the stop, the worker runs the teardown.
            stopped, asked_at = stop_and_wait(funded_alice, instance.id)
            assert "Connection to broker lost" in worker.log()
            assert worker.log().count("Connected to redis://") >= 2
        assert_consistent(instance.id)
        assert_never_charged_twice(stopped, asked_at, gpus=1)
    finally:
        broker.stop()


# --- Duplicates -------------------------------------------------------------------------------------------


def test_it_ignores_a_duplicate_provision_delivery(funded_alice, host, e2e_cloud, e2e_images):
    with e2e_cloud.worker() as worker:
        instance = services.instance_launch(user=funded_alice, size="1x", image_key="cpu")
        # The same message again, while the first is (about to be) at work, and once more when it is ready.
        provision_instance.apply_async(kwargs={"instance_id": str(instance.id)})
        running = wait_for_state(instance.id, Instance.State.RUNNING, Instance.State.FAILED, timeout=60)
        assert running.state == Instance.State.RUNNING, running.failure_reason
        provision_instance.apply_async(kwargs={"instance_id": str(instance.id)})
        wait_for(lambda: len(provision_outcomes(worker)) == 3, timeout=30, what="all three deliveries to run")

        assert sorted(provision_outcomes(worker)) == ["running", "skipped", "skipped"]
        assert len(containers_of(instance.id)) == 1
        assert GpuAllocation.objects.filter(instance_id=instance.id).count() == 1
        assert_consistent(instance.id)
        assert [e.message for e in state_of(instance.id).events.all()].count(
            "Ready: JupyterLab is answering."
        ) == 1


def test_it_makes_one_container_when_a_redelivered_copy_runs_alongside_the_original(
    funded_alice, host, e2e_cloud, e2e_images
):
    # What a visibility timeout expiring mid-launch does: a second worker gets the same launch (as a
    # redelivery, so it resumes rather than skips) while the first is still at it. Both are held at the
    # allocation (on the host's row lock, then on the instance's) and let go together, so they start
    # the container at the same moment.
    with e2e_cloud.worker() as first, e2e_cloud.worker() as second:
        with row_lock("SELECT id FROM provisioning_gpuhost WHERE id = %s FOR UPDATE", host.id) as locked:
            instance = services.instance_launch(user=funded_alice, size="1x", image_key="cpu")
            wait_for(lambda: someone_waits_on(locked), timeout=30, what="a worker to claim the launch")
            provision_instance.apply_async(kwargs={"instance_id": str(instance.id), "resume": True})
            wait_for(lambda: blocked_backends(locked) >= 2, timeout=30, what="the other to wait too")
        running = wait_for_state(instance.id, Instance.State.RUNNING, Instance.State.FAILED, timeout=60)
        assert running.state == Instance.State.RUNNING, running.failure_reason
        wait_for(
            lambda: provision_outcomes(first) and provision_outcomes(second),
            timeout=60,
            what="both workers to finish their copy",
        )

        assert sorted(provision_outcomes(first) + provision_outcomes(second)) == ["running", "skipped"]
        assert len(containers_of(instance.id)) == 1
        assert GpuAllocation.objects.filter(instance_id=instance.id).count() == 1
        assert_consistent(instance.id)
        assert lifecycle.reconcile().orphans_removed == 0
        stopped, asked_at = stop_and_wait(funded_alice, instance.id)

    assert_consistent(instance.id)
    assert_never_charged_twice(stopped, asked_at, gpus=1)
