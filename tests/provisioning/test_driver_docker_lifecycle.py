"""The docker driver's start, stop and poll on the real engine: idempotent, token-protected, workspace kept,
and failures that say whether a retry can help."""

import os
import stat

import httpx
import pytest

from provisioning.drivers import driver_for
from provisioning.drivers.base import DriverError
from provisioning.drivers.docker import container_name, network_name
from provisioning.workspaces import workspace_name
from tests.support.docker_instances import (
    docker_client,
    docker_portal_fixture,  # noqa: F401
    exec_in,
    make_host,
    make_image,
    make_instance,
    status_url,
    wait_for_jupyter,
)
from tests.support.drivers import instance_ref, start_on
from tests.support.images import cpu_image_fixture  # noqa: F401
from tests.support.race import at_once

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300, func_only=True)]


@pytest.fixture
def host(db, kfd_dev_root):
    return make_host("gpu-sim-02", kfd_dev_root.path, kfd_dev_root.render_minors)


@pytest.fixture
def image(db, cpu_image):
    return make_image(cpu_image)


def one_gpu(host, minor=128):
    return list(host.gpus.filter(render_minor=minor))


def containers_named(name):
    return [
        c
        for c in docker_client().containers.list(all=True, ignore_removed=True, filters={"name": name})
        if c.name == name
    ]


def test_it_answers_jupyter_status_only_with_the_token(docker_portal, alice, host, image):
    instance = make_instance(alice, image, host)
    result = start_on(driver_for(host, "docker"), instance, one_gpu(host))

    status = wait_for_jupyter(result.endpoint, instance)
    anonymous = httpx.get(status_url(result.endpoint, instance), follow_redirects=False)
    wrong = httpx.get(status_url(result.endpoint, instance), headers={"Authorization": "token not-the-token"})

    assert result.endpoint.startswith("http://127.0.0.1:")
    assert "last_activity" in status
    assert anonymous.status_code in (401, 403)
    assert wrong.status_code in (401, 403)
    # The token reaches JupyterLab through the environment only, never a command line or URL.
    attrs = docker_client().containers.get(container_name(instance.id)).attrs
    assert instance.jupyter_token not in " ".join(attrs["Args"] + (attrs["Config"]["Cmd"] or []))


def test_it_makes_one_container_when_started_twice(docker_portal, alice, host, image):
    instance = make_instance(alice, image, host)
    driver = driver_for(host, "docker")

    first = start_on(driver, instance, one_gpu(host))
    second = start_on(driver_for(host, "docker"), instance, one_gpu(host))

    assert second.endpoint == first.endpoint
    assert second.state["container_id"] == first.state["container_id"]
    assert len(containers_named(container_name(instance.id))) == 1
    assert len(docker_client().networks.list(names=[network_name(instance.id)])) == 1


def test_two_deliveries_starting_one_instance_at_once_make_one_container_and_one_network(
    docker_portal, transactional_db, alice, host, image
):
    # A redelivered launch task racing the first delivery: both reach the engine at the same moment.
    instance = make_instance(alice, image, host)

    results, errors = at_once(lambda: start_on(driver_for(host, "docker"), instance, one_gpu(host)), timeout=120)

    assert errors == []
    assert len(results) == 2
    assert results[0].state["container_id"] == results[1].state["container_id"]
    assert results[0].endpoint == results[1].endpoint
    assert len(containers_named(container_name(instance.id))) == 1
    assert len(docker_client().networks.list(names=[network_name(instance.id)])) == 1


def test_it_says_missing_before_start_and_after_stop_and_stops_twice(docker_portal, alice, host, image):
    instance = make_instance(alice, image, host)
    driver = driver_for(host, "docker")

    before = driver.poll(instance_ref(instance))
    start_on(driver, instance, one_gpu(host))
    during = driver.poll(instance_ref(instance))
    driver.stop(instance_ref(instance))
    driver.stop(instance_ref(instance))
    after = driver.poll(instance_ref(instance))

    assert (before.status, during.status, after.status) == ("missing", "running", "missing")
    assert containers_named(container_name(instance.id)) == []
    assert docker_client().networks.list(filters={"label": f"devcloud.instance={instance.id}"}) == []
    # The workspace outlives the instance.
    assert docker_client().volumes.get(workspace_name(alice.id)).name == workspace_name(alice.id)


def test_it_reports_an_exited_container_and_starts_it_again(docker_portal, alice, host, image):
    instance = make_instance(alice, image, host)
    driver = driver_for(host, "docker")
    first = start_on(driver, instance, one_gpu(host))
    docker_client().containers.get(container_name(instance.id)).kill()

    exited = driver.poll(instance_ref(instance))
    again = start_on(driver, instance, one_gpu(host))

    assert exited.status == "exited"
    assert again.state["container_id"] == first.state["container_id"]
    assert driver.poll(instance_ref(instance)).status == "running"


def test_it_replaces_a_container_left_from_another_gpu_allocation(docker_portal, alice, host, image):
    instance = make_instance(alice, image, host)
    driver = driver_for(host, "docker")
    start_on(driver, instance, one_gpu(host, 128))

    # A retry after the scheduler moved the instance to another GPU must not keep the old device.
    start_on(driver, instance, one_gpu(host, 176))

    _, listing = exec_in(container_name(instance.id), "ls", "/dev/dri")
    assert listing.split() == ["renderD176"]
    assert len(containers_named(container_name(instance.id))) == 1


def test_it_gives_the_next_launch_the_files_of_the_last(docker_portal, alice, bob, host, image):
    driver = driver_for(host, "docker")
    first = make_instance(alice, image, host)
    start_on(driver, first, one_gpu(host))
    code, output = exec_in(container_name(first.id), "sh", "-c", "echo 'results: 42' > /workspace/notes.txt")
    assert code == 0, output
    driver.stop(instance_ref(first))

    second = make_instance(alice, image, host)
    start_on(driver, second, one_gpu(host, 136))
    bobs = make_instance(bob, image, host)
    start_on(driver, bobs, one_gpu(host, 144))

    _, alices_file = exec_in(container_name(second.id), "cat", "/workspace/notes.txt")
    bobs_code, _ = exec_in(container_name(bobs.id), "test", "-e", "/workspace/notes.txt")
    assert alices_file.strip() == "results: 42"
    assert bobs_code != 0, "Bob sees Alice's workspace"


def test_it_lists_the_instances_this_portal_manages(docker_portal, alice, host, image):
    instance = make_instance(alice, image, host)
    driver = driver_for(host, "docker")
    start_on(driver, instance, one_gpu(host))
    # Another portal on the same engine: same labels, other portal id. Never ours to manage.
    other = docker_client().containers.create(
        image.reference,
        labels={
            "devcloud.managed": "true",
            "devcloud.portal": f"{docker_portal}-other",
            "devcloud.instance": "x",
        },
    )
    try:
        managed = driver.managed_instance_ids()
        driver.stop(instance_ref(instance))
        after_stop = driver.managed_instance_ids()
    finally:
        other.remove(force=True)

    assert managed == {str(instance.id)}
    assert after_stop == set()


def test_it_fails_for_good_when_the_image_is_not_on_the_host(docker_portal, alice, host):
    image = make_image("devcloud/not-built:000000000000", key="missing")
    instance = make_instance(alice, image, host)
    driver = driver_for(host, "docker")

    with pytest.raises(DriverError) as failure:
        start_on(driver, instance, one_gpu(host))

    assert failure.value.permanent is True
    assert "devcloud/not-built:000000000000" in failure.value.message
    assert "build or pre-pull" in failure.value.message
    # Nothing half-made is left for a retry to trip over.
    assert driver.poll(instance_ref(instance)).status == "missing"
    assert docker_client().networks.list(filters={"label": f"devcloud.instance={instance.id}"}) == []


def test_it_fails_for_good_when_a_render_node_is_missing(docker_portal, alice, host, image, kfd_dev_root):
    kfd_dev_root.render_node(152).unlink()
    instance = make_instance(alice, image, host)

    with pytest.raises(DriverError) as failure:
        start_on(driver_for(host, "docker"), instance, one_gpu(host, 152))

    assert failure.value.permanent is True
    assert "renderD152" in failure.value.message
    assert containers_named(container_name(instance.id)) == []


@pytest.mark.parametrize("docker_url", ["unix:///nonexistent.sock", "tcp://127.0.0.1:1"])
def test_it_fails_for_now_when_the_engine_cannot_be_reached(docker_url, alice, host, image, host_pki):
    host.docker_url = docker_url
    if docker_url.startswith("tcp://"):
        host.tls_ca_cert, host.tls_client_cert, host.tls_client_key = (
            host_pki.ca_cert,
            host_pki.client_cert,
            host_pki.client_key,
        )
    instance = make_instance(alice, image, host)
    driver = driver_for(host, "docker")

    for call in (
        lambda: start_on(driver, instance, one_gpu(host)),
        lambda: driver.stop(instance_ref(instance)),
        lambda: driver.poll(instance_ref(instance)),
    ):
        with pytest.raises(DriverError) as failure:
            call()
        assert failure.value.permanent is False
        assert "cannot be reached" in failure.value.message


def test_it_never_reaches_an_engine_on_plain_tcp_even_when_a_host_was_saved_with_one(alice, host, image):
    # Saved before the rule, or written to the database by hand: nothing is sent to it.
    host.docker_url = "tcp://127.0.0.1:1"
    instance = make_instance(alice, image, host)

    with pytest.raises(DriverError) as failure:
        start_on(driver_for(host, "docker"), instance, one_gpu(host))

    assert failure.value.permanent is True
    assert "Refused: tcp://127.0.0.1:1 has no TLS." in failure.value.message


def test_it_keeps_tls_material_in_private_files(alice, host, image):
    host.docker_url = "tcp://127.0.0.1:1"
    host.tls_ca_cert = "-----BEGIN CERTIFICATE-----\nnot really\n-----END CERTIFICATE-----\n"
    host.tls_client_cert = host.tls_ca_cert
    host.tls_client_key = "-----BEGIN PRIVATE KEY-----\nsecret\n-----END PRIVATE KEY-----\n"
    driver = driver_for(host, "docker")

    with pytest.raises(DriverError):
        driver.poll(instance_ref(make_instance(alice, image, host)))

    # Each engine client writes its own copy, in a directory of its own under the driver's.
    written = [
        os.path.join(folder, name) for folder, _, names in os.walk(driver.engine._tls_dir) for name in names
    ]
    assert sorted(os.path.basename(path) for path in written) == ["ca.pem", "cert.pem", "key.pem"]
    assert {stat.S_IMODE(os.stat(path).st_mode) for path in written} == {0o600}
    folders = [folder for folder, _, _ in os.walk(driver.engine._tls_dir)]
    assert {stat.S_IMODE(os.stat(folder).st_mode) for folder in folders} == {0o700}
