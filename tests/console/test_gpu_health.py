"""Operators see a GPU drained by its health check on the host's GPU map and in /metrics, and return it to
service from the console (audited, with a reason); staff without the permission cannot."""

import pytest
from django.urls import reverse

from portal.audit.models import AuditEntry
from provisioning import health
from provisioning.models import Gpu
from tests.conftest import make_staff

from .test_metrics import scrape, token  # noqa: F401 -- the metrics token fixture

pytestmark = pytest.mark.django_db


@pytest.fixture
def drained(gpu_health_host, gpu_health_files):
    """renderD136 of gpu-01 drained: its uncorrectable errors rose between two beats."""
    health.hosts_heartbeat()
    gpu_health_files.ras(136, ue=7, ce=2)
    health.hosts_heartbeat()
    gpu = Gpu.objects.get(host=gpu_health_host, render_minor=136)
    assert gpu.is_drained
    return gpu


def return_url(gpu):
    return reverse("admin:provisioning_gpuhost_gpu_return", args=[gpu.host_id, gpu.pk])


def test_the_gpu_map_shows_the_drained_gpu_with_its_reason_and_the_way_back(otto_client, drained):
    page = otto_client.get(reverse("admin:provisioning_gpuhost_change", args=[drained.host_id]))

    html = page.content.decode()
    assert 'data-testid="gpu-drained"' in html
    assert "Uncorrectable RAS errors rose from 0 to 7 since the last reading." in html
    assert return_url(drained) in html
    assert "ok (errors: 0 uncorrectable, 0 correctable)" in html


def test_metrics_count_the_drained_gpu_on_its_host_and_its_error_counts(client, token, drained):  # noqa: F811
    samples = scrape(client, **token)

    assert samples[("devcloud_gpus_drained", (("host", "gpu-01"),))] == 1
    gpu = (("gpu", "renderD136"), ("host", "gpu-01"))
    assert samples[("devcloud_gpu_ras_errors", (*gpu, ("kind", "uncorrectable")))] == 7
    assert samples[("devcloud_gpu_ras_errors", (*gpu, ("kind", "correctable")))] == 2


def test_an_operator_returns_the_gpu_to_service_with_a_reason_and_it_is_audited(otto_client, otto, drained):
    refused = otto_client.post(return_url(drained), {"reason": "", "_confirm": "1"})
    assert refused.status_code == 200
    assert Gpu.objects.get(pk=drained.pk).is_drained

    response = otto_client.post(return_url(drained), {"reason": "Reseated the module; dmesg clean.", "_confirm": "1"})

    assert response.status_code == 302
    assert not Gpu.objects.get(pk=drained.pk).is_drained
    entry = AuditEntry.objects.get(action="gpu.return")
    assert entry.actor == otto and entry.reason == "Reseated the module; dmesg clean."
    assert entry.details["drained_because"] == "Uncorrectable RAS errors rose from 0 to 7 since the last reading."
    drained.host.refresh_from_db()
    assert drained.host.gpus_free == 8


def test_staff_without_the_activate_permission_cannot_return_a_gpu(client, drained):
    client.force_login(make_staff("hank@ops.example.com", "provisioning.view_gpuhost", "provisioning.change_gpuhost"))

    response = client.post(return_url(drained), {"reason": "Trust me."})

    assert response.status_code == 403
    assert Gpu.objects.get(pk=drained.pk).is_drained
