"""The instance's page in the console shows the last lines of its real container's log (the CPU JupyterLab
image on the local Docker engine), without the user's Jupyter token."""

import os
import uuid

import pytest
from django.test import Client
from django.urls import reverse

from portal.credits import services as credits
from portal.instances import lifecycle, services
from provisioning.drivers import driver_for
from provisioning.drivers.docker import container_name
from tests.conftest import MI300X_RENDER_MINORS, make_kfd_dev_root
from tests.support.docker_instances import (
    docker_client,
    docker_portal_fixture,  # noqa: F401  (registers the docker_portal fixture)
    make_host,
    make_image,
)
from tests.support.drivers import instance_ref
from tests.support.images import cpu_image_fixture  # noqa: F401  (registers cpu_image)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300, func_only=True)]


@pytest.fixture
def running(db, alice, tmp_path, settings, docker_portal, cpu_image):
    if os.geteuid() != 0:
        pytest.skip("creating device nodes (mknod) needs root")
    settings.DEVCLOUD_DRIVER = "docker"
    settings.READY_TIMEOUT_SECONDS = 90
    dev_root = make_kfd_dev_root(tmp_path / "host-dev", MI300X_RENDER_MINORS)
    make_host("gpu-sim-console", dev_root.path, dev_root.render_minors)
    make_image(cpu_image, key="cpu")
    credits.credits_adjust(
        user=alice, gpu_seconds=25 * 3600, reason="Test", actor=None, idempotency_key=str(uuid.uuid4())
    )
    instance = services.instance_launch(user=alice, size="1x", image_key="cpu")
    assert lifecycle.instance_provision(instance_id=instance.id) == "running"
    instance.refresh_from_db()
    return instance


def test_the_instance_page_shows_the_container_log_tail_without_the_token(olivia, running):
    # Something only this container printed, and the token, as a notebook could print it any time.
    marker = f"console-log-marker-{uuid.uuid4().hex}"
    docker_client().containers.get(container_name(running.id)).exec_run(
        ["sh", "-c", f'echo {marker} > /proc/1/fd/1; echo "my token is $JUPYTER_TOKEN" > /proc/1/fd/1']
    )
    client = Client()
    client.force_login(olivia)

    page = client.get(reverse("admin:instances_instance_change", args=[running.id])).content.decode()

    log = page.split('data-testid="container-log">', 1)[1].split("</pre>", 1)[0]
    assert marker in log
    assert "Jupyter" in log  # JupyterLab's own startup lines, from the same container
    assert "my token is [token hidden]" in log
    assert running.jupyter_token not in page


def test_the_driver_returns_at_most_the_lines_asked_for(running):
    container = docker_client().containers.get(container_name(running.id))
    for number in range(5):
        container.exec_run(["sh", "-c", f"echo tail-line-{number} > /proc/1/fd/1"])

    tail = driver_for(running.host, "docker").logs(instance_ref(running), tail=3)

    assert tail.splitlines() == ["tail-line-2", "tail-line-3", "tail-line-4"]
