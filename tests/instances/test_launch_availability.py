"""Launches that only an operator can unblock: an image on no host, an image still being built, no host in
service, no image at all. The developer sees why on the launch page and nothing is queued or charged; the
operator sees the problem with a link to the fix on the console's dashboard; the log says what to do."""

import logging
import uuid

import pytest
from django.utils import timezone
from pytest_django.asserts import assertContains, assertNotContains

from portal.credits import services as credits
from portal.instances import services
from portal.instances.models import Instance
from provisioning.drivers import fake
from provisioning.models import GpuHost, HostImage, ImageJob

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("cloud")]


@pytest.fixture
def funded_alice(alice):
    credits.credits_adjust(
        user=alice, gpu_seconds=10 * 3600, reason="Test credit", actor=None, idempotency_key=str(uuid.uuid4())
    )
    return alice


@pytest.fixture
def host(db):
    return fake.make_host("gpu-01")


@pytest.fixture
def cpu(db):
    return fake.make_image("cpu", name="CPU JupyterLab")


@pytest.fixture
def pytorch(db):
    return fake.make_image("pytorch", name="PyTorch")


def record(host, image, *, present):
    HostImage.objects.create(host=host, reference=image.reference, present=present, checked_at=timezone.now())


def test_it_refuses_an_image_that_is_on_no_host_and_tells_the_operators_what_to_do(
    funded_alice, host, cpu, pytorch, caplog
):
    record(host, cpu, present=True)
    record(host, pytorch, present=False)

    with caplog.at_level(logging.WARNING):
        with pytest.raises(Exception) as refused:
            services.instance_launch(user=funded_alice, size="1x", image_key="pytorch")

    assert "The PyTorch image is not on any GPU host yet" in str(refused.value)
    assert not Instance.objects.exists()
    assert "build or pre-pull it from a host's page" in caplog.text


def test_it_launches_an_image_a_host_has(funded_alice, host, cpu):
    record(host, cpu, present=True)

    instance = services.instance_launch(user=funded_alice, size="1x", image_key="cpu")

    assert instance.state in (Instance.State.QUEUED, Instance.State.PROVISIONING, Instance.State.RUNNING)


def test_it_still_launches_on_hosts_whose_images_were_never_looked_at(funded_alice, host, cpu):
    assert services.instance_launch(user=funded_alice, size="1x", image_key="cpu")


def test_the_launch_page_shows_how_far_the_default_image_build_is_and_launches_nothing_meanwhile(
    client, funded_alice, host, cpu
):
    cpu.is_default = True
    cpu.save()
    ImageJob.objects.create(host=host, image=cpu, reference=cpu.reference, state="running", percent=45)
    client.force_login(funded_alice)

    page = client.get("/instances/")

    assertContains(page, "Being prepared on gpu-01: 45% done")
    assertContains(page, 'http-equiv="refresh"')
    assertContains(page, 'data-testid="launch" disabled')
    assertContains(page, "The CPU JupyterLab image is being prepared on gpu-01 (45% done)")
    refused = client.post("/instances/launch/", {"size": "1x", "image": "cpu"})
    assert refused.status_code == 400
    assertContains(refused, "being prepared", status_code=400)
    assert not Instance.objects.exists()


def test_the_launch_page_marks_an_image_no_host_has_and_keeps_the_others(client, funded_alice, host, cpu, pytorch):
    record(host, cpu, present=True)
    record(host, pytorch, present=False)
    client.force_login(funded_alice)

    page = client.get("/instances/")

    assertContains(page, 'data-testid="image-pytorch-missing"')
    assertNotContains(page, 'data-testid="image-cpu-missing"')
    assertNotContains(page, 'data-testid="launch" disabled')


def test_the_pages_say_plainly_that_a_simulated_hosts_gpus_are_simulated(client, funded_alice, host, cpu, olivia):
    GpuHost.objects.filter(pk=host.pk).update(is_simulated=True)
    client.force_login(funded_alice)

    assertContains(client.get("/instances/"), 'data-testid="simulated-note"')
    instance = services.instance_launch(user=funded_alice, size="1x", image_key="cpu")
    assertContains(client.get(f"/instances/{instance.id}/"), "Simulated GPUs")

    client.force_login(olivia)
    assertContains(client.get("/console/"), 'data-testid="simulated-hosts"')


def test_the_launch_page_says_a_launch_waits_when_no_host_is_in_service(client, funded_alice, cpu):
    client.force_login(funded_alice)

    assertContains(client.get("/instances/"), 'data-testid="no-host-note"')


def test_the_console_dashboard_lists_each_blocker_with_a_link_to_its_fix(client, olivia, host, cpu, pytorch):
    record(host, pytorch, present=False)
    GpuHost.objects.filter(pk=host.pk).update(state=GpuHost.State.DRAINING)
    client.force_login(olivia)

    page = client.get("/console/")

    assertContains(page, "No GPU host is in service")
    assertContains(page, 'href="/admin/provisioning/gpuhost/"')
    # The draining host's records do not count: an image is "on no host" only among hosts in service.
    assertNotContains(page, "The PyTorch image")

    GpuHost.objects.filter(pk=host.pk).update(state=GpuHost.State.ACTIVE)
    page = client.get("/console/")
    assertContains(page, "The PyTorch image (devcloud/pytorch:test) is on no GPU host in service")
    assertNotContains(page, "No GPU host is in service")


def test_the_console_dashboard_says_when_no_image_is_enabled(client, olivia, host):
    client.force_login(olivia)

    page = client.get("/console/")

    assertContains(page, "No image is enabled")
    assertContains(page, 'href="/admin/instances/image/"')


def test_the_console_dashboard_shows_no_blockers_when_launches_can_go_ahead(client, olivia, host, cpu):
    record(host, cpu, present=True)
    client.force_login(olivia)

    assertNotContains(client.get("/console/"), 'data-testid="launch-blockers"')
