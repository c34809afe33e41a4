"""Workspaces follow their owner across the fleet's hosts (real engines over mutual TLS): a file written
on one host is there when the next launch lands on the other, a copy that does not arrive whole fails the
launch and keeps the files where they were, a host that does not answer does not hold the launch up, and
deleting the account removes containers and volumes on every host."""

import uuid

import pytest

from portal.accounts.services import account_delete
from portal.audit.models import AuditEntry
from portal.credits import services as credits
from portal.credits.models import LedgerEntry
from portal.instances import lifecycle, services
from portal.instances.models import Instance
from provisioning import workspaces
from provisioning.drivers.docker import container_name
from provisioning.models import Gpu, GpuHost, Workspace, WorkspaceRemoval
from provisioning.workspaces import workspace_name
from tests.support.docker_instances import make_image, remove_portal_objects

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600, func_only=True)]


@pytest.fixture(scope="module")
def image(fleet, fleet_cpu_image):
    for host in fleet.hosts:
        fleet.pull(host, fleet_cpu_image)
    return fleet_cpu_image


@pytest.fixture
def portal(fleet, settings):
    """A portal id of this test's own; what it left on the fleet's engines is removed afterwards."""
    portal_id = f"test-ws-{uuid.uuid4().hex[:10]}"
    settings.DEVCLOUD_PORTAL_ID = portal_id
    settings.DEVCLOUD_DRIVER = "docker"
    settings.READY_TIMEOUT_SECONDS = 120
    yield portal_id
    for host in fleet.hosts:
        host.restart()
        client = host.client()
        for container in client.containers.list(
            all=True, ignore_removed=True, filters={"label": workspaces.HELPER_LABEL}
        ):
            container.remove(force=True)
        remove_portal_objects(portal_id, client)
        client.close()


@pytest.fixture
def hosts(db, fleet, portal):
    """GpuHost rows for the fleet's first two hosts, as an operator adds them (GPUs and gids discovered)."""
    made = []
    for fleet_host in fleet.hosts[:2]:
        host = GpuHost.objects.create(
            **fleet_host.gpuhost_fields(),
            kfd_gid=fleet_host.render_gid,
            cpus_per_gpu=0.25,
            memory_mb_per_gpu=512,
        )
        Gpu.objects.bulk_create(
            [
                Gpu(
                    host=host,
                    node_id=index + 1,
                    gpu_id=50000 + index,
                    render_minor=minor,
                    render_gid=fleet_host.render_gid,
                )
                for index, minor in enumerate(fleet_host.render_minors)
            ]
        )
        made.append(host)
    return made


@pytest.fixture
def launch(alice, hosts, image):
    credits.credits_adjust(
        user=alice, gpu_seconds=25 * 3600, reason="Test", actor=None, idempotency_key=str(uuid.uuid4())
    )
    catalogue_image = make_image(image, key="cpu-ws")

    def make(*, on: GpuHost, expect="running"):
        """Launches for alice with every other host drained, so it lands on `on`; returns the instance."""
        GpuHost.objects.exclude(pk=on.pk).update(state=GpuHost.State.DRAINING)
        GpuHost.objects.filter(pk=on.pk).update(state=GpuHost.State.ACTIVE)
        instance = services.instance_launch(user=alice, size="1x", image_key=catalogue_image.key)
        assert lifecycle.instance_provision(instance_id=instance.id) == expect, timeline(instance)
        instance.refresh_from_db()
        assert instance.host_id == on.pk
        return instance

    return make


def fleet_host(fleet, host: GpuHost):
    return next(h for h in fleet.hosts if h.name == host.name)


def timeline(instance) -> str:
    return "\n".join(instance.events.values_list("message", flat=True))


def sh(fleet, instance, command: str) -> str:
    container = fleet_host(fleet, instance.host).client().containers.get(container_name(instance.id))
    code, output = container.exec_run(["sh", "-c", command], user="1000:1000")
    assert code == 0, output
    return output.decode()


def stop(instance):
    services.instance_stop(user=instance.user, instance_id=instance.id)
    assert lifecycle.instance_teardown(instance_id=instance.id) == "stopped"


def volumes_of(fleet, host: GpuHost, portal_id: str) -> list[str]:
    client = fleet_host(fleet, host).client()
    return [v.name for v in client.volumes.list(filters={"label": f"devcloud.portal={portal_id}"})]


def containers_of(fleet, host: GpuHost, portal_id: str) -> list[str]:
    client = fleet_host(fleet, host).client()
    label = {"label": f"devcloud.portal={portal_id}"}
    return [c.name for c in client.containers.list(all=True, ignore_removed=True, filters=label)]


def test_it_brings_a_file_written_on_one_host_to_the_next_launch_on_the_other(
    fleet, hosts, launch, portal, alice
):
    host_a, host_b = hosts
    first = launch(on=host_a)
    sh(fleet, first, "mkdir -p /workspace/thesis && echo 'chapter one' > /workspace/thesis/draft.md")
    stop(first)

    second = launch(on=host_b)

    assert sh(fleet, second, "cat /workspace/thesis/draft.md") == "chapter one\n"
    assert sh(fleet, second, "stat -c '%u %a' /workspace/thesis/draft.md").split()[0] == "1000"
    events = timeline(second)
    assert f"Moving your workspace from {host_a.name} to {host_b.name}." in events
    assert f"Moving your workspace from {host_a.name}: " in events and " MB" in events
    assert f"Your workspace arrived whole on {host_b.name}" in events
    workspace = Workspace.objects.get(user=alice)
    assert workspace.host == host_b
    assert volumes_of(fleet, host_a, portal) == []
    assert volumes_of(fleet, host_b, portal) == [workspace_name(alice.pk)]


def test_it_fails_the_launch_and_keeps_the_files_when_the_copy_does_not_arrive_whole(
    fleet, hosts, launch, portal, alice, monkeypatch
):
    host_a, host_b = hosts
    first = launch(on=host_a)
    sh(fleet, first, "echo 'results' > /workspace/results.csv")
    stop(first)

    def tamper(client, volume):
        client.containers.run(
            image_of(first), entrypoint=["sh", "-c", "echo forged >> /workspace/results.csv"],
            mounts=[{"Target": "/workspace", "Source": volume, "Type": "volume"}],
            network_mode="none", remove=True,
        )  # fmt: skip

    monkeypatch.setattr(workspaces, "before_verify_hook", tamper)

    second = launch(on=host_b, expect="failed")

    assert second.state == Instance.State.FAILED
    assert "did not arrive whole" in second.failure_reason
    assert "file contents differ" in second.failure_reason
    assert f"untouched on {host_a.name}" in second.failure_reason
    assert second.ready_at is None and second.metered_until is None
    usage = LedgerEntry.objects.filter(kind=LedgerEntry.Kind.USAGE, reason__contains=second.short_id)
    assert not usage.exists()
    assert Workspace.objects.get(user=alice).host == host_a
    assert volumes_of(fleet, host_a, portal) == [workspace_name(alice.pk)]
    assert volumes_of(fleet, host_b, portal) == []
    monkeypatch.setattr(workspaces, "before_verify_hook", None)
    third = launch(on=host_a)
    assert sh(fleet, third, "cat /workspace/results.csv") == "results\n"


def image_of(instance) -> str:
    return instance.image.reference


def test_it_starts_without_the_files_when_their_host_does_not_answer_and_says_so(
    fleet, hosts, launch, portal, alice
):
    host_a, host_b = hosts
    first = launch(on=host_a)
    sh(fleet, first, "echo 'kept' > /workspace/kept.txt")
    stop(first)
    fleet_host(fleet, host_a).kill()
    try:
        second = launch(on=host_b)
    finally:
        fleet_host(fleet, host_a).restart()

    assert sh(fleet, second, "ls -A /workspace") == ""
    assert f"Your workspace is on {host_a.name}, which does not answer" in timeline(second)
    assert Workspace.objects.get(user=alice).host == host_a
    stop(second)

    # Once it answers, the next launch brings the files.
    third = launch(on=host_b)
    assert sh(fleet, third, "cat /workspace/kept.txt") == "kept\n"
    assert Workspace.objects.get(user=alice).host == host_b


def test_deleting_the_account_removes_its_containers_and_volumes_on_every_host(
    fleet, hosts, launch, portal, alice
):
    host_a, host_b = hosts
    on_a = launch(on=host_a)
    # The workspace is in use on host A, so the launch on B gets B's own volume: one on each host.
    on_b = launch(on=host_b)
    assert "another of your instances is using" in timeline(on_b)
    assert volumes_of(fleet, host_a, portal) and volumes_of(fleet, host_b, portal)

    account_delete(user=alice)
    # Before the teardowns, each volume is still mounted by its container: both hosts stay on record.
    assert workspaces.workspace_removals_run() == {"removed": 0, "left": 2}
    assert "in use" in WorkspaceRemoval.objects.filter(user=alice).first().last_error
    for instance in (on_a, on_b):
        assert lifecycle.instance_teardown(instance_id=instance.id) == "stopped"
    workspaces.workspace_removals_run()

    for host in hosts:
        assert containers_of(fleet, host, portal) == []
        assert volumes_of(fleet, host, portal) == []
    assert not Workspace.objects.filter(user=alice).exists()
    assert not WorkspaceRemoval.objects.filter(user=alice).exists()
    assert AuditEntry.objects.filter(action="account.workspaces_removed", target_id=str(alice.pk)).exists()


def test_deleting_the_account_removes_its_workspace_on_a_host_where_it_runs_nothing(
    fleet, hosts, launch, portal, alice
):
    host_a, host_b = hosts
    on_a = launch(on=host_a)
    on_b = launch(on=host_b)  # host A's volume is in use: B gets its own
    stop(on_a)
    assert volumes_of(fleet, host_a, portal) == [workspace_name(alice.pk)]
    assert containers_of(fleet, host_a, portal) == []

    account_delete(user=alice)
    assert lifecycle.instance_teardown(instance_id=on_b.id) == "stopped"
    workspaces.workspace_removals_run()

    for host in hosts:
        assert containers_of(fleet, host, portal) == []
        assert volumes_of(fleet, host, portal) == []
    entry = AuditEntry.objects.get(action="account.workspaces_removed", target_id=str(alice.pk))
    assert f"{workspace_name(alice.pk)} on {host_a.name}" in entry.details["volumes"]
