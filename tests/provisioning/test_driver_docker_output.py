"""The docker driver follows a container's output on the engine's log stream: it sees JupyterLab say it
serves, and gives up at its deadline, when cancelled, and when the container is gone."""

import threading
import time

import pytest

from portal.instances.lifecycle import JUPYTER_SERVING_LINE
from provisioning.drivers import driver_for
from tests.support.docker_instances import (
    docker_portal_fixture,  # noqa: F401
    make_host,
    make_image,
    make_instance,
    status_url,
)
from tests.support.drivers import instance_ref, start_on
from tests.support.images import cpu_image_fixture  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300, func_only=True)]


@pytest.fixture
def host(db, kfd_dev_root):
    return make_host("gpu-sim-03", kfd_dev_root.path, kfd_dev_root.render_minors)


@pytest.fixture
def started(docker_portal, alice, host, cpu_image):
    instance = make_instance(alice, make_image(cpu_image), host)
    driver = driver_for(host, "docker")
    endpoint = start_on(driver, instance, list(host.gpus.filter(render_minor=128))).endpoint
    return driver, instance, endpoint


def test_it_sees_jupyterlab_say_it_serves_and_the_lab_then_answers(started):
    import httpx

    driver, instance, endpoint = started

    seen = driver.wait_for_output(instance_ref(instance), JUPYTER_SERVING_LINE, time.monotonic() + 120, threading.Event())

    assert seen is True
    # The readiness wait then asks 20 times a second; the lab answers within a moment of the line
    # (before it, docker's port proxy may still reset the connection).
    answers = []
    for _ in range(100):
        try:
            answers.append(
                httpx.get(
                    status_url(endpoint, instance), headers={"Authorization": f"token {instance.jupyter_token}"}
                ).status_code
            )
        except httpx.TransportError as error:
            answers.append(repr(error))
        if answers[-1] == 200:
            break
        time.sleep(0.05)
    assert answers[-1] == 200, answers


def test_it_gives_up_at_the_deadline_and_when_cancelled(started):
    driver, instance, _ = started
    cancelled = threading.Event()

    at_deadline = driver.wait_for_output(instance_ref(instance), "a line nothing prints", time.monotonic() + 1.5, cancelled)
    threading.Timer(1.0, cancelled.set).start()
    began = time.monotonic()
    on_cancel = driver.wait_for_output(instance_ref(instance), "a line nothing prints", time.monotonic() + 120, cancelled)

    assert at_deadline is False
    assert on_cancel is False
    assert time.monotonic() - began < 30


def test_it_answers_no_for_an_instance_whose_container_is_gone(started):
    driver, instance, _ = started
    driver.stop(instance_ref(instance))

    assert driver.wait_for_output(instance_ref(instance), JUPYTER_SERVING_LINE, time.monotonic() + 60, threading.Event()) is False
