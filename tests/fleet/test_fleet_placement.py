"""Placement across the fleet's hosts (registered over mutual TLS, GPUs discovered through their engines):
30 launches at once, each in its own thread with its own database connection, go through the launch and
allocation path (services.instance_launch, whose provision task runs lifecycle.instance_provision, whose
scheduler.allocate PostgreSQL serialises). The containers are started by the fake driver, so that 30
JupyterLabs need not start on a 2-core machine; placement and allocation run on the real fleet hosts' rows.

Two hosts of 8 GPUs take 16 launches, spread over both, and queue the other 14; no GPU has two holders."""

import threading
import uuid
from collections import Counter

import pytest
from django.db import connection

from portal.credits import services as credits
from portal.instances import services
from portal.instances.models import Instance
from provisioning import services as hosts_services
from provisioning.drivers import fake
from provisioning.models import Gpu, GpuAllocation, GpuHost
from tests.conftest import make_user

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600, func_only=True)]

LAUNCHES = 30
USERS = 10


@pytest.fixture
def registered(transactional_db, fleet, image, settings):
    settings.DEVCLOUD_PORTAL_ID = f"test-place-{uuid.uuid4().hex[:8]}"
    settings.DEVCLOUD_DRIVER = "docker"
    made = [
        hosts_services.host_register(
            name=fleet_host.name,
            docker_url=fleet_host.docker_url,
            private_address=fleet_host.private_address,
            tls_ca_cert=fleet_host.tls_ca_cert,
            tls_client_cert=fleet_host.tls_client_cert,
            tls_client_key=fleet_host.tls_client_key,
            sysfs_root=fleet_host.sysfs_root,
            dev_root=fleet_host.dev_root,
        )
        for fleet_host in fleet.hosts[:2]
    ]
    # The containers: the fake driver's (see the module docstring); the hosts stay the fleet's.
    fake.install()
    settings.DEVCLOUD_DRIVER = "fake"
    return made


def launch_in_thread(user, image_key, results, errors, start):
    try:
        start.wait()
        # The launch's provision task runs in this thread once the launch commits (tasks run inline in
        # tests), as a worker would run it.
        instance = services.instance_launch(user=user, size="1x", image_key=image_key)
        results.append(Instance.objects.get(pk=instance.pk).state)
    except Exception as error:  # noqa: BLE001 -- reported by the test
        errors.append(repr(error))
    finally:
        connection.close()


def test_thirty_concurrent_launches_spread_over_the_hosts_and_never_double_book_a_gpu(registered):
    assert all(Gpu.objects.filter(host=host, is_present=True).count() == 8 for host in registered)
    fake.make_image("cpu-place")
    users = []
    for index in range(USERS):
        user = make_user(f"placer{index}@example.com")
        credits.credits_adjust(
            user=user, gpu_seconds=25 * 3600, reason="Test", actor=None, idempotency_key=str(uuid.uuid4())
        )
        users.append(user)
    results, errors, start = [], [], threading.Event()
    threads = [
        threading.Thread(
            target=launch_in_thread, args=(users[index % USERS], "cpu-place", results, errors, start)
        )
        for index in range(LAUNCHES)
    ]
    for thread in threads:
        thread.start()
    start.set()
    for thread in threads:
        thread.join(timeout=300)

    assert errors == []
    assert Counter(results) == {Instance.State.RUNNING: 16, Instance.State.QUEUED: 14}
    live = GpuAllocation.objects.filter(released_at__isnull=True)
    # One live holder per GPU, and each holder's GPUs on the host its instance was placed on.
    assert live.count() == 16
    assert live.values("gpu").distinct().count() == 16
    held = live.select_related("gpu", "instance")
    assert all(allocation.gpu.host_id == allocation.instance.host_id for allocation in held)
    running = Instance.objects.filter(state=Instance.State.RUNNING)
    placed = Counter(running.values_list("host__name", flat=True))
    assert placed == {host.name: 8 for host in registered}
    assert Instance.objects.filter(state=Instance.State.QUEUED).count() == 14
    assert set(GpuHost.objects.values_list("state", flat=True)) == {GpuHost.State.ACTIVE}
