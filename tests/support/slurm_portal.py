"""The portal in front of the test Slurm cluster (tests/support/slurm.py): the cluster registered as an
operator registers it, a callback server where the nodes reach the portal, and helpers that drive the
lifecycle the way a worker does.

The nodes live in network namespaces and reach this machine at the cluster's controller address, so the
portal's report endpoint is served there too (uvicorn in a thread, on the test database).
"""

import time
import uuid
from pathlib import Path

import pytest

from portal.instances import lifecycle
from portal.instances.models import Instance
from provisioning.drivers import slurm as slurm_driver
from provisioning.models import GpuHost
from provisioning.slurm import clusters
from provisioning.slurm.rest import SlurmRest
from tests.e2e.helpers import wait_for as wait
from tests.gateway.helpers import ServerThread

SLURM_USER = "root"


@pytest.fixture(scope="session")
def slurm_callback_server(slurm_cluster, django_db_setup):
    """The portal served at the address the nodes reach this machine by, for the jobs' reports."""
    server = ServerThread(host=slurm_cluster.controller_address)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def slurm_partition(transactional_db, slurm_cluster, slurm_callback_server, cpu_image, settings) -> GpuHost:
    """The cluster registered through the operators' service, with this test's portal id (so its jobs'
    names are its own) and shared directories of its own; returns the partition's GpuHost. Every job
    still live at the end is cancelled and the nodes are idle again for the next test."""
    if not settings.DEVCLOUD_PORTAL_ID.startswith("test-"):
        # A portal id of this test's own (an e2e test's workers already have one; keep theirs).
        settings.DEVCLOUD_PORTAL_ID = f"test-slurm-{uuid.uuid4().hex[:8]}"
    # The nodes report to the portal at this machine's address on their network.
    settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, slurm_cluster.controller_address]
    # Jobs report from their nodes every second, so a node's death is seen within a second or two.
    settings.SLURM_JOB_HEARTBEAT_SECONDS = 1
    rootfs = slurm_cluster.rootfs_for(cpu_image)
    shared = Path(slurm_cluster.directory) / "shared" / settings.DEVCLOUD_PORTAL_ID
    for name in ("workspaces", "jobs"):
        (shared / name).mkdir(parents=True, exist_ok=True)
    shared.chmod(0o755)
    cluster = clusters.cluster_register(
        actor=None,
        name="hpc",
        rest_url=slurm_cluster.rest_url,
        rest_user=SLURM_USER,
        token=slurm_cluster.token(SLURM_USER),
        partitions=[slurm_cluster.partition],
        gres_name=slurm_cluster.gres_name,
        image_root=str(rootfs.parent),
        workspace_root=str(shared / "workspaces"),
        job_root=str(shared / "jobs"),
        device_dir=str(slurm_cluster.device_dir("{node}")),
        callback_url=slurm_callback_server.url,
    )
    partition = cluster.partitions.get()
    # Each test node has 16 CPUs and 4,000 MB: shares that let an 8x instance fit on one node.
    GpuHost.objects.filter(pk=partition.pk).update(cpus_per_gpu=1, memory_mb_per_gpu=400)
    partition.refresh_from_db()
    yield partition
    cancel_all(slurm_cluster)


def rest_of(slurm_cluster) -> SlurmRest:
    return SlurmRest(slurm_cluster.rest_url, user_name=SLURM_USER, token=slurm_cluster.token(SLURM_USER))


def cancel_all(slurm_cluster) -> None:
    """Cancel every live job and wait until the nodes are idle."""
    with rest_of(slurm_cluster) as rest:
        live = [job for job in rest.jobs() if not job.ended]
        for job in live:
            rest.cancel(job.job_id)
        deadline = time.monotonic() + 20
        while live and time.monotonic() < deadline:
            live = [job for job in rest.jobs() if not job.ended]
            time.sleep(0.1)
    slurm_cluster.wait_until_idle([node.name for node in slurm_cluster.nodes], timeout=30)


def hold_gpus(slurm_cluster, gpus: int, *, node: str | None = None) -> int:
    """Another user's job holding `gpus` GPUs (on `node`, when given); returns its id once it runs."""
    job = {
        "name": f"someone-else-{uuid.uuid4().hex[:6]}",
        "gres": f"{slurm_cluster.gres_name}:{gpus}",
        "no_requeue": True,
        "time_limit": 10,
        "current_working_directory": "/tmp",
        "standard_output": "/dev/null",
        "environment": {"PATH": "/usr/bin:/bin"},
    }
    if node:
        job["nodelist"] = node
    with rest_of(slurm_cluster) as rest:
        job_id = rest.submit(script="#!/bin/bash\nexec sleep 600\n", job=job)
        wait(lambda: rest.job(job_id).state == "RUNNING", timeout=20, what=f"job {job_id} to run")
    return job_id


def provision(instance_id, *, until: str = Instance.State.RUNNING, timeout: float = 90) -> Instance:
    """Ask the lifecycle about a launch as its task does (again while the cluster keeps it pending),
    until it reaches `until`; returns the instance. Fails on any other final state."""
    deadline = time.monotonic() + timeout
    while True:
        instance = Instance.objects.get(pk=instance_id)
        if instance.state == until:
            return instance
        if instance.state in (Instance.State.FAILED, Instance.State.STOPPED):
            raise AssertionError(f"the launch ended {instance.state}: {instance.failure_reason}")
        if time.monotonic() > deadline:
            raise AssertionError(f"the launch is {instance.state}/{instance.step}, not {until}")
        lifecycle.instance_provision(instance_id=instance_id, resume=True)


@pytest.fixture
def quick_pending(monkeypatch):
    """A start hands a pending job back after a second instead of waiting START_WAIT_SECONDS."""
    monkeypatch.setattr(slurm_driver, "START_WAIT_SECONDS", 1.0)
