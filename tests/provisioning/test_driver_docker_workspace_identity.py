"""A workspace volume is only ever mounted for the person and install it was made for (real engine):
two installs sharing an engine see neither each other's files nor each other's containers, a new account
that gets an old numeric id starts with an empty /workspace, and a volume labelled for someone else
refuses the launch and is left as it was."""

import uuid

import pytest
from django.contrib.auth import get_user_model

from portal.audit.models import AuditEntry
from portal.instances import lifecycle
from portal.instances.models import Instance
from provisioning import identity
from provisioning.drivers import driver_for
from provisioning.drivers.base import DriverError
from provisioning.drivers.docker import container_name
from provisioning.models import Installation, Workspace
from provisioning.workspaces import workspace_name
from tests.support.docker_instances import (
    docker_client,
    exec_in,
    make_host,
    make_image,
    make_instance,
    remove_portal_objects,
)
from tests.support.drivers import start_on
from tests.support.images import cpu_image_fixture  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300, func_only=True)]

SECRET = "/workspace/secret.txt"


@pytest.fixture
def installs(settings):
    """Switches this process between two install ids kept in the Installation row, as two installs sharing
    the engine would each have; removes what either made afterwards."""
    settings.DEVCLOUD_PORTAL_ID = ""  # no override: the stored id counts
    made = []

    def become(install_id):
        Installation.objects.update_or_create(pk=1, defaults={"install_id": install_id})
        identity.forget()
        made.append(install_id)
        return install_id

    yield become
    identity.forget()
    for install_id in made:
        remove_portal_objects(install_id)


@pytest.fixture
def host(db, kfd_dev_root):
    return make_host("gpu-sim-ident", kfd_dev_root.path, kfd_dev_root.render_minors)


@pytest.fixture
def image(db, cpu_image):
    return make_image(cpu_image)


def launch(user, image, host):
    instance = make_instance(user, image, host)
    result = start_on(driver_for(host, "docker"), instance, list(host.gpus.filter(render_minor=128)))
    Instance.objects.filter(pk=instance.pk).update(state=Instance.State.RUNNING, driver_state=result.state)
    Workspace.objects.get_or_create(user=user, defaults={"host": host, "volume_name": result.state["volume"]})
    return instance


def workspace_files(instance):
    code, output = exec_in(container_name(instance.id), "ls", "-A", "/workspace")
    assert code == 0, output
    return output.split()


def test_two_installs_on_one_engine_see_neither_each_others_files_nor_containers(
    installs, transactional_db, alice, host, image
):
    install_a = installs(f"test-a-{uuid.uuid4().hex[:8]}")
    first = launch(alice, image, host)
    code, output = exec_in(container_name(first.id), "sh", "-c", f"echo alice-a > {SECRET}")
    assert code == 0, output
    volume_a = workspace_name(alice.pk)

    # Install B on the same engine: its own database, whose person has the same numeric id as alice.
    installs(f"test-b-{uuid.uuid4().hex[:8]}")
    Workspace.objects.filter(user=alice).delete()
    get_user_model().objects.filter(pk=alice.pk).update(workspace_key=uuid.uuid4())
    Instance.objects.filter(pk=first.pk).update(state=Instance.State.STOPPED)  # B's database never had it
    alice.refresh_from_db()
    second = launch(alice, image, host)

    assert workspace_name(alice.pk) != volume_a
    assert workspace_files(second) == []
    # B's reconciler sees only B's containers: A's instance (unknown to B) is no orphan of B's.
    report = lifecycle.reconcile()
    assert report.orphans_removed == 0
    assert docker_client().containers.get(container_name(first.id)).status == "running"
    assert docker_client().volumes.get(volume_a).attrs["Labels"]["devcloud.portal"] == install_a
    code, output = exec_in(container_name(first.id), "cat", SECRET)
    assert (code, output.strip()) == (0, "alice-a")


def test_a_new_account_with_a_reused_numeric_id_starts_with_an_empty_workspace(
    installs, transactional_db, host, image
):
    # A database restored from before this account, or `make clean`: the volume stays on the engine.
    installs(f"test-r-{uuid.uuid4().hex[:8]}")
    users = get_user_model().objects
    old = users.create_user(email="first@example.com", password="x", email_verified_at="2026-01-01T00:00Z")
    before = launch(old, image, host)
    code, output = exec_in(container_name(before.id), "sh", "-c", f"echo first-owner > {SECRET}")
    assert code == 0, output
    old_volume = workspace_name(old.pk)
    docker_client().containers.get(container_name(before.id)).remove(force=True)
    user_id = old.pk
    Instance.objects.filter(user_id=user_id).delete()
    users.filter(pk=user_id).delete()  # gone without the account deletion that removes volumes

    newcomer = users.create_user(
        id=user_id, email="second@example.com", password="x", email_verified_at="2026-01-01T00:00Z"
    )
    after = launch(newcomer, image, host)

    assert newcomer.pk == user_id
    assert workspace_name(newcomer.pk) != old_volume
    assert workspace_files(after) == []
    assert docker_client().volumes.get(old_volume).name == old_volume  # kept, for an operator to sort out


def test_a_volume_labelled_for_another_owner_refuses_the_launch_and_is_left_untouched(
    installs, db, alice, bob, host, image
):
    install = installs(f"test-x-{uuid.uuid4().hex[:8]}")
    # Bob's workspace row names a volume that carries Alice's key (a restore gone wrong, or a forgery).
    planted = f"{install}-ws-planted-{uuid.uuid4().hex[:6]}"
    alices = {
        "devcloud.managed": "true",
        "devcloud.portal": install,
        "devcloud.owner": alice.workspace_key.hex,
        "devcloud.user": str(alice.pk),
    }
    docker_client().volumes.create(planted, labels=alices)
    Workspace.objects.create(user=bob, host=host, volume_name=planted)
    instance = make_instance(bob, image, host)

    with pytest.raises(DriverError) as refused:
        start_on(driver_for(host, "docker"), instance, list(host.gpus.filter(render_minor=128)))

    assert refused.value.permanent
    assert "not yours" in refused.value.message
    assert "another person" in refused.value.message
    entry = AuditEntry.objects.get(action="workspace.mount_refused")
    assert entry.target_id == str(bob.pk) and planted in entry.reason
    assert docker_client().volumes.get(planted).attrs["Labels"] == alices
    assert (
        docker_client().containers.list(
            all=True, ignore_removed=True, filters={"name": container_name(instance.id)}
        )
        == []
    )


def test_a_volume_of_another_install_with_this_persons_name_is_refused(installs, db, alice, host, image):
    installs(f"test-y-{uuid.uuid4().hex[:8]}")
    name = workspace_name(alice.pk)
    foreign = {"devcloud.managed": "true", "devcloud.portal": "someone-else", "devcloud.user": str(alice.pk)}
    docker_client().volumes.create(name, labels=foreign)
    instance = make_instance(alice, image, host)
    try:
        with pytest.raises(DriverError) as refused:
            start_on(driver_for(host, "docker"), instance, list(host.gpus.filter(render_minor=128)))
        assert "another DevCloud install" in refused.value.message
        assert docker_client().volumes.get(name).attrs["Labels"] == foreign
    finally:
        docker_client().volumes.get(name).remove(force=True)
