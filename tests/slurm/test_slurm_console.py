"""The Slurm cluster's console pages, against the real test cluster: registration refuses a wrong token,
an unreachable URL and an unknown partition saying which and what to do, saves nothing then, and the
cluster's page shows its nodes, their GPUs and DevCloud's instances on them from Slurm's own view."""

import pytest

from portal.instances import services
from portal.lib.sealed import unseal
from provisioning.models import GpuHost, SlurmCluster
from tests.conftest import give
from tests.support.slurm_portal import SLURM_USER, provision

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.timeout(180, func_only=True)]

ADD = "/admin/provisioning/slurmcluster/add/"


def registration(slurm_cluster, **changes) -> dict:
    form = {
        "name": "hpc",
        "rest_url": slurm_cluster.rest_url,
        "rest_user": SLURM_USER,
        "token": slurm_cluster.token(SLURM_USER),
        "partition_names": slurm_cluster.partition,
        "gres_name": slurm_cluster.gres_name,
        "image_root": "/srv/devcloud/images",
        "workspace_root": "/srv/devcloud/workspaces",
        "job_root": "/srv/devcloud/jobs",
        "device_dir": "/dev",
        "callback_url": "https://devcloud.example",
    }
    return {**form, **changes}


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"token": "eyJhbGciOiJIUzI1NiJ9.e30.forged"}, "refused the token for user root"),
        ({"rest_url": "http://127.0.0.1:9"}, "does not answer at http://127.0.0.1:9"),
        ({"partition_names": "gpu, bigmem"}, "The cluster has no partition named bigmem"),
        ({"gres_name": "mps"}, "No node of partition gpu offers GRES &#x27;mps&#x27;"),
    ],
)
def test_registration_refuses_what_would_not_work_and_says_which(olivia_client, slurm_cluster, changes, says):
    answer = olivia_client.post(ADD, registration(slurm_cluster, **changes))

    assert answer.status_code == 200
    assert says in answer.content.decode()
    assert not SlurmCluster.objects.exists()
    assert not GpuHost.objects.filter(backend="slurm").exists()


def test_a_registered_cluster_shows_its_nodes_and_the_instances_on_them(
    olivia_client, otto_client, alice, slurm_cluster, slurm_partition, cpu_image
):
    from portal.instances.catalog import catalog_sync

    catalog_sync()
    give(alice, 5)
    instance = provision(services.instance_launch(user=alice, size="1x", image_key="cpu").id)
    cluster = slurm_partition.slurm_cluster

    page = olivia_client.get(f"/admin/provisioning/slurmcluster/{cluster.pk}/change/").content.decode()
    seen_by_operator = otto_client.get(f"/admin/provisioning/slurmcluster/{cluster.pk}/change/")

    for node in slurm_cluster.nodes:
        assert f'data-testid="node-{node.name}"' in page
    assert instance.short_id in page and alice.email in page
    assert "gpu:8" in page
    assert seen_by_operator.status_code == 200
    assert otto_client.post(ADD, registration(slurm_cluster, name="other")).status_code == 403
    # The token is kept sealed and never shown again.
    assert slurm_cluster.token(SLURM_USER)[:20] not in page
    assert unseal(cluster.token_sealed).count(".") == 2


def test_registering_through_the_console_makes_the_partition_a_place_for_launches(olivia_client, slurm_cluster):
    answer = olivia_client.post(ADD, registration(slurm_cluster))

    assert answer.status_code == 302, answer.content.decode()[:3000]
    cluster = SlurmCluster.objects.get(name="hpc")
    partition = GpuHost.objects.get(slurm_cluster=cluster)
    assert (partition.name, partition.backend, partition.slurm_partition) == ("hpc/gpu", "slurm", "gpu")
    assert cluster.token_sealed and slurm_cluster.token(SLURM_USER)[:20] not in cluster.token_sealed
