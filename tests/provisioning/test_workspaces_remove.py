"""Deleting an account removes its workspace volumes on every host: what a host that does not answer
still holds is kept on record and removed when it answers again, and the removal is audited once done."""

import pytest

from portal.accounts.services import account_delete
from portal.audit.models import AuditEntry
from provisioning.drivers.docker_engine import portal_id, volume_labels, volume_name
from provisioning.models import GpuHost, Workspace, WorkspaceRemoval
from provisioning.workspaces import owner_key, workspace_removals_run, workspaces_remove_all
from tests.support.docker_instances import LOCAL_ENGINE, docker_client, docker_portal_fixture  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120, func_only=True)]

UNREACHABLE = "unix:///nonexistent/docker.sock"


@pytest.fixture
def engine(docker_portal):
    return docker_client()


def volumes_of(engine, user):
    portal = portal_id()
    volumes = engine.volumes.list(filters={"label": f"devcloud.user={user.pk}"})
    return [v.name for v in volumes if v.attrs["Labels"].get("devcloud.portal") == portal]


def test_it_removes_the_volumes_on_hosts_that_answer_and_retries_the_others_until_done(
    db, engine, alice, bob
):
    here = GpuHost.objects.create(name="gpu-here", docker_url=LOCAL_ENGINE)
    away = GpuHost.objects.create(name="gpu-away", docker_url=UNREACHABLE)
    GpuHost.objects.create(name="gpu-retired", docker_url=UNREACHABLE, state=GpuHost.State.RETIRED)
    engine.volumes.create(volume_name(owner_key(alice.pk)), labels=volume_labels(alice.pk, owner_key(alice.pk)))
    engine.volumes.create(volume_name(owner_key(bob.pk)), labels=volume_labels(bob.pk, owner_key(bob.pk)))
    Workspace.objects.create(user=alice, host=here, volume_name=volume_name(owner_key(alice.pk)))

    assert workspaces_remove_all(user_id=alice.pk) == 2
    outcome = workspace_removals_run(user_id=alice.pk)

    assert outcome == {"removed": 1, "left": 1}
    assert volumes_of(engine, alice) == []
    assert volumes_of(engine, bob) == [volume_name(owner_key(bob.pk))]
    assert not Workspace.objects.filter(user=alice).exists()
    left = WorkspaceRemoval.objects.get(user=alice)
    assert left.host == away and left.attempts == 1 and left.last_error
    assert not AuditEntry.objects.filter(action="account.workspaces_removed").exists()

    # The host answers again (here: its address now reaches an engine) and beat runs the task.
    GpuHost.objects.filter(pk=away.pk).update(docker_url=LOCAL_ENGINE)
    engine.volumes.create(volume_name(owner_key(alice.pk)), labels=volume_labels(alice.pk, owner_key(alice.pk)))
    assert workspace_removals_run() == {"removed": 1, "left": 0}

    assert volumes_of(engine, alice) == []
    assert not WorkspaceRemoval.objects.exists()
    entry = AuditEntry.objects.get(action="account.workspaces_removed")
    assert entry.target_id == str(alice.pk) and entry.actor is None


def test_deleting_an_account_records_a_removal_for_every_host_in_service(db, alice, settings):
    settings.CELERY_TASK_ALWAYS_EAGER = False
    hosts = [GpuHost.objects.create(name=f"gpu-{n}", docker_url=UNREACHABLE) for n in range(3)]
    Workspace.objects.create(user=alice, host=hosts[0], volume_name=volume_name(owner_key(alice.pk)))

    account_delete(user=alice)

    recorded = WorkspaceRemoval.objects.filter(user=alice).values_list("host_id", flat=True)
    assert set(recorded) == {host.pk for host in hosts}
    assert not Workspace.objects.filter(user=alice).exists()
