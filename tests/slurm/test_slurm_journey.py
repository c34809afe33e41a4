"""A developer's journey on a Slurm cluster, with nothing stood in: launch from the page, a real worker
submits the job through slurmrestd, JupyterLab runs a cell through the gateway, SSH through the jump
gateway runs a command, and stopping from the page cancels the job and charges the ledger."""

import pytest
from django.urls import reverse
from django.utils import timezone

from portal.credits.selectors import balance_for
from portal.instances.models import Instance
from provisioning.models import SlurmJob
from tests.conftest import give
from tests.e2e.helpers import run_in_kernel, usage_charged, wait_until_ready_for
from tests.e2e.test_launch_journey import launch_from_the_page, seconds, wait_for_page_state
from tests.gateway.helpers import session_cookie_for
from tests.sshgateway.conftest import add_key
from tests.support.slurm_portal import rest_of

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True), pytest.mark.timeout(240, func_only=True)]


def test_a_developer_launches_on_slurm_from_the_page_works_in_jupyterlab_and_over_ssh_and_stops(
    client, alice, e2e_cloud, e2e_images, e2e_gateway, slurm_partition, slurm_cluster, keygen, ssh_as
):
    give(alice, 10)
    before = balance_for(alice)
    key = keygen("alice-laptop")
    add_key(alice, key, "laptop")
    session = session_cookie_for(client, alice)

    with e2e_cloud.worker():
        instance_id = launch_from_the_page(client)
        status = wait_for_page_state(client, instance_id, "running", timeout=120)
        instance = Instance.objects.get(pk=instance_id)
        job = SlurmJob.objects.get(instance_id=instance_id)

        assert instance.host == slurm_partition
        assert any("Submitted to the Slurm cluster hpc" in event["message"] for event in status["events"])
        assert run_in_kernel(e2e_gateway, session, instance_id, "print(6 * 7)") == ["42\n"]
        over_ssh = ssh_as(key).run(instance.short_id, "python3", "-c", "'import os; print(os.getuid(), 6 * 7)'")
        assert over_ssh.returncode == 0, over_ssh.stderr
        assert over_ssh.stdout.strip() == "1000 42"

        # Billing is in whole seconds from ready to the stop request; the cell and the command can take
        # less than one, so the stop waits until there is a second to charge.
        wait_until_ready_for(instance, 1.5)
        before_stop = timezone.now()
        assert client.post(reverse("instances:stop", args=[instance_id])).status_code == 302
        after_stop = timezone.now()
        wait_for_page_state(client, instance_id, "stopped", timeout=60)

    with rest_of(slurm_cluster) as rest:
        assert rest.job(job.job_id).ended
    charged = usage_charged(instance_id)
    stopped = Instance.objects.get(pk=instance_id)
    assert charged == stopped.charged_gpu_seconds > 0
    assert seconds(before_stop - stopped.ready_at) <= charged <= seconds(after_stop - stopped.ready_at)
    assert balance_for(alice) == before - charged
