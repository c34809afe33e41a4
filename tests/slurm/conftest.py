"""The test Slurm cluster (tests/support/slurm.py): munge, slurmctld, slurmrestd and two slurmds in network
namespaces, with eight stand-in GPUs each. Other test packages get the same fixture with the same import."""

import time

import pytest

from provisioning.slurm.rest import SlurmRest
from tests.support.slurm import slurm_cluster_fixture  # noqa: F401


@pytest.fixture
def slurm_rest(slurm_cluster):
    """A SlurmRest client of the cluster, as root with a fresh token. Every job still live when the test
    ends is cancelled, so the next test finds every GPU free."""
    client = SlurmRest(slurm_cluster.rest_url, user_name="root", token=slurm_cluster.token())
    yield client
    live = [job for job in client.jobs() if not job.ended]
    for job in live:
        client.cancel(job.job_id)
    deadline = time.monotonic() + 15
    while live and time.monotonic() < deadline:
        live = [job for job in client.jobs() if not job.ended]
        time.sleep(0.1)
    names = [node.name for node in slurm_cluster.nodes]
    slurm_cluster.wait_until_idle(names, timeout=30)
    client.close()
# The portal in front of the cluster (tests/support/slurm_portal.py), and the e2e and SSH fixtures the
# journey reuses: a real worker, the gateway, the SSH jump gateway.
from tests.e2e.conftest import e2e_cloud, e2e_gateway, e2e_images, e2e_portal  # noqa: F401
from tests.sshgateway.conftest import gateway, keygen, ssh_as  # noqa: F401
from tests.support.images import cpu_image_fixture  # noqa: F401
from tests.support.slurm_portal import quick_pending, slurm_callback_server, slurm_partition  # noqa: F401
