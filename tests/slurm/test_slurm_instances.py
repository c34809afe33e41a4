"""Instances on a real Slurm cluster (tests/support/slurm.py), as their owners, the operators and an
attacker would notice: Slurm places them, each sees only its own GPUs, a launch waits in the cluster's
queue saying why, and every failure (a dead node, a restarting slurmctld, a job cancelled behind
DevCloud's back, a bad token, slurmrestd gone) ends in a state that is charged right and said plainly."""

import ast
import time
import uuid
from pathlib import Path

import pytest
from django.urls import reverse
from django.utils import timezone

from portal.audit.models import AuditEntry
from portal.credits.selectors import balance_for
from portal.instances import lifecycle, services
from portal.instances.models import Instance
from portal.instances.stop_reasons import StopReason
from portal.lib.sealed import seal
from portal.notifications.models import Notification
from provisioning.models import SlurmCluster, SlurmJob
from provisioning.slurm import clusters
from tests.conftest import give
from tests.e2e.helpers import run_in_kernel, usage_charged
from tests.gateway.helpers import ServerThread, session_cookie_for
from tests.support.slurm_portal import (
    SLURM_USER,
    hold_gpus,
    provision,
    rest_of,
    wait,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240, func_only=True)]


# Opens every render node the container sees; the devices cgroup says ENXIO for its own (no driver
# behind the stand-in), EPERM for every other.
OPEN_EVERY_GPU = """
import errno, os
seen = {}
for name in sorted(os.listdir('/dev/dri')):
    try:
        os.close(os.open('/dev/dri/' + name, os.O_RDWR))
        seen[name] = 'opened'
    except OSError as error:
        seen[name] = errno.errorcode[error.errno]
print(seen)
"""


@pytest.fixture(scope="module")
def lab_gateway(django_db_setup):
    server = ServerThread()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def image(transactional_db, cpu_image):
    from portal.instances.catalog import catalog_sync

    catalog_sync()
    return Instance._meta.get_field("image").related_model.objects.get(key="cpu")


def launch(user, size="1x") -> str:
    return str(services.instance_launch(user=user, size=size, image_key="cpu").id)


def job_of(instance_id):
    return SlurmJob.objects.get(instance_id=instance_id)


def gpus_seen(server, client, user, instance_id) -> dict:
    [printed] = run_in_kernel(server, session_cookie_for(client, user), instance_id, OPEN_EVERY_GPU)
    return ast.literal_eval(printed)


def test_it_runs_a_launch_as_a_slurm_job_and_stops_it_charged(
    alice, image, slurm_partition, slurm_cluster, lab_gateway, client
):
    give(alice, 10)
    before = balance_for(alice)

    instance = provision(launch(alice))

    record = job_of(instance.id)
    with rest_of(slurm_cluster) as rest:
        job = rest.job(record.job_id)
    assert job.state == "RUNNING" and job.name.endswith(str(instance.id))
    assert instance.host == slurm_partition and instance.driver == "slurm"
    assert instance.driver_state["endpoint"].startswith(f"http://{slurm_cluster.node(record.node).address}:")
    # JupyterLab through the gateway, as the owner's browser reaches it.
    session = session_cookie_for(client, alice)
    assert run_in_kernel(lab_gateway, session, instance.id, "import os; print(os.getuid(), os.getcwd())") == [
        "1000 /workspace\n"
    ]

    time.sleep(1.2)
    services.instance_stop(user=alice, instance_id=instance.id)
    instance.refresh_from_db()

    assert instance.state == Instance.State.STOPPED
    with rest_of(slurm_cluster) as rest:
        assert rest.job(record.job_id).ended
    charged = usage_charged(instance.id)
    assert charged >= 1
    assert balance_for(alice) == before - charged



def test_a_stopped_instance_leaves_no_job_directory_behind_and_keeps_its_workspace(
    alice, image, slurm_partition, slurm_cluster, lab_gateway, client
):
    give(alice, 10)
    instance = provision(launch(alice))
    cluster = slurm_partition.slurm_cluster
    job_dir = Path(cluster.job_root) / str(job_of(instance.id).job_id)
    assert (job_dir / "bundle" / "config.json").exists() and (job_dir / "home").is_dir()
    run_in_kernel(lab_gateway, session_cookie_for(client, alice), instance.id, "open('kept.txt', 'w').write('mine')")

    services.instance_stop(user=alice, instance_id=instance.id)

    assert not job_dir.exists()
    [workspace] = [path for path in Path(cluster.workspace_root).iterdir() if (path / "kept.txt").exists()]
    assert (workspace / "kept.txt").read_text() == "mine"


def test_eight_gpus_take_a_whole_node_and_two_one_gpu_instances_see_only_their_own(
    alice, bob, image, slurm_partition, slurm_cluster, lab_gateway, client
):
    give(alice, 100)
    give(bob, 10)
    alice.extra_sizes = ["8x"]  # an operator opened 8x to her
    alice.save(update_fields=["extra_sizes"])
    eight = provision(launch(alice, "8x"))
    big_node = job_of(eight.id).node
    other_node = next(node.name for node in slurm_cluster.nodes if node.name != big_node)

    ones = [provision(launch(user)) for user in (alice, bob)]

    assert {job_of(one.id).node for one in ones} == {other_node}
    seen = [gpus_seen(lab_gateway, client, user, one.id) for user, one in zip((alice, bob), ones)]
    own = [[name for name, result in gpus.items() if result == "ENXIO"] for gpus in seen]
    assert len(own[0]) == len(own[1]) == 1 and own[0] != own[1]
    for gpus, mine in zip(seen, own):
        assert {result for name, result in gpus.items() if name not in mine} == {"EPERM"}
    assert list(gpus_seen(lab_gateway, client, alice, eight.id).values()) == ["ENXIO"] * 8


def test_a_launch_with_every_gpu_held_waits_with_slurms_reason_and_starts_when_one_frees(
    alice, image, slurm_partition, slurm_cluster, quick_pending, client
):
    give(alice, 10)
    holders = [hold_gpus(slurm_cluster, 8, node=node.name) for node in slurm_cluster.nodes]

    instance_id = launch(alice)
    lifecycle.instance_provision(instance_id=instance_id, resume=True)

    waiting = Instance.objects.get(pk=instance_id)
    assert waiting.state == Instance.State.PROVISIONING
    client.force_login(alice)
    page = client.get(reverse("instances:status", args=[instance_id])).json()
    assert any("waiting for GPUs to free up on the cluster" in event["message"] for event in page["events"])
    assert usage_charged(instance_id) == 0

    with rest_of(slurm_cluster) as rest:
        rest.cancel(holders[0])
    running = provision(instance_id)

    assert running.state == Instance.State.RUNNING
    assert job_of(instance_id).node == slurm_cluster.nodes[0].name


def test_a_dead_node_ends_its_instance_as_host_down_charged_to_its_last_sighting(
    alice, bob, image, slurm_partition, slurm_cluster, quick_pending
):
    give(alice, 10)
    give(bob, 10)
    first, second = slurm_cluster.nodes
    hold_gpus(slurm_cluster, 8, node=second.name)
    hold_gpus(slurm_cluster, 7, node=first.name)
    instance = provision(launch(alice))
    assert job_of(instance.id).node == first.name
    waiting_id = launch(bob)
    lifecycle.instance_provision(instance_id=waiting_id, resume=True)
    time.sleep(1.5)  # a heartbeat or two from the node
    seen_running = job_of(instance.id).last_seen_running_at
    assert seen_running is not None

    # The node dies: its network goes and its slurmd with it.
    killed_at = timezone.now()
    slurm_cluster.cut_node(first.name)
    try:

        def settled():
            lifecycle.reconcile()
            return Instance.objects.get(pk=instance.id).state in (Instance.State.STOPPING, Instance.State.STOPPED)

        wait(settled, timeout=60, what="the instance on the dead node to be settled", interval=1)
        stopped = Instance.objects.get(pk=instance.id)
        assert stopped.stop_reason == StopReason.HOST_DOWN
        # Charged up to the job's last report from its node, before the node died, not up to when Slurm
        # noticed (NODE_FAIL, many seconds later) or DevCloud settled it.
        charged = usage_charged(instance.id)
        assert charged == stopped.charged_gpu_seconds
        assert int((seen_running - stopped.ready_at).total_seconds()) <= charged
        assert charged <= int((killed_at - stopped.ready_at).total_seconds()) + 1
        assert Notification.objects.filter(user=alice, event_key=f"instance:{instance.id}:stopped").exists()

        # The launch that waited in the queue lands on the node that is alive, once that has room.
        with rest_of(slurm_cluster) as rest:
            for job in rest.jobs():
                if job.name.startswith("someone-else") and job.nodes == second.name and not job.ended:
                    rest.cancel(job.job_id)
        landed = provision(waiting_id)
        assert job_of(landed.id).node == second.name
    finally:
        slurm_cluster.restore_node(first.name)


def test_slurmctld_restarting_during_a_launch_loses_nothing_and_charges_once(
    alice, image, slurm_partition, slurm_cluster, quick_pending
):
    give(alice, 10)
    instance_id = launch(alice)
    wait(lambda: SlurmJob.objects.filter(instance_id=instance_id, job_id__isnull=False).exists(), timeout=30,
         what="the job to be submitted")

    slurm_cluster.restart_controller()
    running = provision(instance_id)
    lifecycle.meter_tick()
    lifecycle.meter_tick()
    services.instance_stop(user=alice, instance_id=instance_id)

    with rest_of(slurm_cluster) as rest:
        named = [job for job in rest.jobs() if job.name.endswith(instance_id)]
    assert len(named) == 1
    stopped = Instance.objects.get(pk=instance_id)
    assert stopped.state == Instance.State.STOPPED
    assert usage_charged(instance_id) == stopped.charged_gpu_seconds
    assert stopped.charged_gpu_seconds <= int((stopped.state_changed_at - running.ready_at).total_seconds()) + 1


def test_the_reconciler_cancels_a_stray_job_and_settles_one_cancelled_behind_its_back(
    alice, image, slurm_partition, slurm_cluster, settings
):
    give(alice, 10)
    stray_name = f"devcloud-{settings.DEVCLOUD_PORTAL_ID}-{uuid.uuid4()}"
    with rest_of(slurm_cluster) as rest:
        stray = rest.submit(
            script="#!/bin/bash\nexec sleep 600\n",
            job={"name": stray_name, "gres": "gpu:1", "no_requeue": True, "time_limit": 5,
                 "current_working_directory": "/tmp", "standard_output": "/dev/null",
                 "environment": {"PATH": "/usr/bin:/bin"}},
        )
    instance = provision(launch(alice))
    with rest_of(slurm_cluster) as rest:
        rest.cancel(job_of(instance.id).job_id)
        wait(lambda: rest.job(job_of(instance.id).job_id).ended, timeout=20, what="the cancel")

    report = lifecycle.reconcile()

    with rest_of(slurm_cluster) as rest:
        assert rest.job(stray).ended
    assert report.orphans_removed == 1
    settled = Instance.objects.get(pk=instance.id)
    assert settled.state == Instance.State.FAILED
    assert "ended outside DevCloud" in settled.failure_reason
    assert not (Path(slurm_partition.slurm_cluster.job_root) / str(job_of(instance.id).job_id)).exists()


def test_a_bad_token_and_an_unreachable_slurmrestd_are_told_to_the_operator_and_charge_nothing(
    alice, image, slurm_partition, slurm_cluster, quick_pending
):
    give(alice, 10)
    cluster = slurm_partition.slurm_cluster
    registration = dict(
        rest_user=SLURM_USER, partitions=["gpu"], gres_name="gpu", image_root="/i", workspace_root="/w",
        job_root="/j", callback_url="http://127.0.0.1:1",
    )
    with pytest.raises(clusters.ClusterRefused) as refused:
        clusters.cluster_register(actor=None, name="typo", rest_url=slurm_cluster.rest_url, token="not-a-jwt",
                                  **registration)
    assert refused.value.field == "token" and "scontrol token" in refused.value.message
    with pytest.raises(clusters.ClusterRefused) as refused:
        clusters.cluster_register(actor=None, name="gone", rest_url="http://127.0.0.1:9", token="x",
                                  **registration)
    assert refused.value.field == "rest_url" and "does not answer" in refused.value.message
    with pytest.raises(clusters.ClusterRefused) as refused:
        clusters.cluster_register(actor=None, name="other", rest_url=slurm_cluster.rest_url,
                                  token=slurm_cluster.token(SLURM_USER), **{**registration, "partitions": ["cpu"]})
    assert refused.value.field == "partitions" and "no partition named cpu" in refused.value.message

    good_token = cluster.token_sealed
    SlurmCluster.objects.filter(pk=cluster.pk).update(token_sealed=seal("eyJhbGciOiJIUzI1NiJ9.e30.bad"))
    assert clusters.clusters_check() == {"hpc": SlurmCluster.Health.TOKEN_REFUSED}
    assert AuditEntry.objects.filter(action="slurm.token_refused").exists()
    refused_launch = launch(alice)
    assert Instance.objects.get(pk=refused_launch).state == Instance.State.PROVISIONING
    assert "refused DevCloud's token" in Instance.objects.get(pk=refused_launch).events.last().message

    SlurmCluster.objects.filter(pk=cluster.pk).update(token_sealed=good_token)
    slurm_cluster.stop_rest()
    try:
        assert clusters.clusters_check() == {"hpc": SlurmCluster.Health.UNREACHABLE}
        assert AuditEntry.objects.filter(action="slurm.cluster_unreachable").exists()
        lifecycle.instance_provision(instance_id=refused_launch, resume=True)
        assert "does not answer" in Instance.objects.get(pk=refused_launch).events.last().message
    finally:
        slurm_cluster.start_rest()
    assert clusters.clusters_check() == {"hpc": SlurmCluster.Health.OK}

    assert provision(refused_launch).state == Instance.State.RUNNING
    assert usage_charged(refused_launch) == 0
