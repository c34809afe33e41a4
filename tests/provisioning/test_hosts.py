"""Registering GPU hosts, checking their Docker engine (socket and mutual TLS), and discovering GPUs."""

import os
import shutil
import socket
import stat

import pytest

from provisioning import services
from provisioning.inventory import InventoryError
from provisioning.models import Gpu, GpuAllocation, GpuHost
from provisioning.scheduler import allocate
from provisioning.services import HostError, HostUnreachable
from tests.conftest import MI300X_RENDER_MINORS, issue_certificate, pem

pytestmark = pytest.mark.django_db

LOCAL_ENGINE = "unix:///var/run/docker.sock"
NODES = "sys/class/kfd/kfd/topology/nodes"


def closed_port() -> int:
    """A loopback port nothing listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def editable_sysfs(tmp_path, kfd_sysfs_8gpu):
    root = tmp_path / "sysfs"
    shutil.copytree(kfd_sysfs_8gpu, root)
    return root


def unreachable_tls_engine(host_pki) -> dict:
    """Mutual TLS settings for an engine at a loopback port nothing listens on."""
    return {
        "docker_url": f"tcp://127.0.0.1:{closed_port()}",
        "tls_ca_cert": host_pki.ca_cert,
        "tls_client_cert": host_pki.client_cert,
        "tls_client_key": host_pki.client_key,
    }


def register(name, sysfs_root, **options):
    return services.host_register(name=name, docker_url=LOCAL_ENGINE, sysfs_root=str(sysfs_root), **options)


# --- Registration and discovery ----------------------------------------------------------------------


def test_it_registers_a_host_after_reaching_its_engine_and_discovers_its_gpus(kfd_sysfs_2socket):
    host = register("gpu-01", kfd_sysfs_2socket)

    gpus = list(host.gpus.order_by("node_id"))
    assert [gpu.node_id for gpu in gpus] == [2, 3, 4, 5, 6, 7, 8, 9]
    assert [gpu.render_minor for gpu in gpus] == MI300X_RENDER_MINORS
    assert (gpus[0].gpu_id, gpus[0].location_id, gpus[0].unique_id) == (28851, 0x0500, "4376936076086227261")
    assert {gpu.vram_bytes for gpu in gpus} == {206141652992}
    assert host.last_seen_at is not None
    assert host.state == GpuHost.State.ACTIVE


def test_it_refuses_to_register_a_host_whose_engine_does_not_answer(kfd_sysfs_8gpu, host_pki):
    engine = unreachable_tls_engine(host_pki)
    url = engine["docker_url"]

    with pytest.raises(HostUnreachable) as error:
        services.host_register(
            name="gpu-dead", private_address="127.0.0.1", sysfs_root=str(kfd_sysfs_8gpu), **engine
        )

    assert f"Cannot reach the Docker engine at {url}" in error.value.message
    assert not GpuHost.objects.exists()


def test_it_refuses_to_register_a_host_whose_kfd_topology_cannot_be_read(tmp_path):
    with pytest.raises(InventoryError, match="No KFD topology"):
        register("gpu-nosysfs", tmp_path)

    assert not GpuHost.objects.exists()


def test_it_upserts_gpus_by_node_and_changes_nothing_when_run_again(editable_sysfs):
    host = register("gpu-01", editable_sysfs)
    ids = dict(host.gpus.values_list("node_id", "pk"))

    again = services.host_discover(host_id=host.pk)

    assert (again.added, again.updated, again.vanished, again.present) == ([], [], [], 8)
    assert dict(host.gpus.values_list("node_id", "pk")) == ids


def test_it_marks_a_vanished_gpu_absent_and_keeps_the_row_its_instance_holds(
    editable_sysfs, alice, host_queued_instance
):
    host = register("gpu-01", editable_sysfs)
    eight = host_queued_instance(alice, size="8x")
    allocate(instance_id=eight.pk)
    shutil.rmtree(editable_sysfs / NODES / "3")

    summary = services.host_discover(host_id=host.pk)

    assert summary.vanished == [3] and summary.vanished_held == [3]
    assert "still held by an instance: nodes 3" in str(summary)
    gpu = Gpu.objects.get(host=host, node_id=3)
    assert gpu.is_present is False
    assert GpuAllocation.objects.filter(gpu=gpu, instance=eight, released_at__isnull=True).exists()
    assert host.gpus.filter(is_present=True).count() == 7


def test_it_brings_back_a_gpu_that_reappears(editable_sysfs, tmp_path):
    host = register("gpu-01", editable_sysfs)
    shutil.move(editable_sysfs / NODES / "5", tmp_path / "node5")
    services.host_discover(host_id=host.pk)
    shutil.move(tmp_path / "node5", editable_sysfs / NODES / "5")

    summary = services.host_discover(host_id=host.pk)

    assert summary.updated == [5]
    assert host.gpus.filter(is_present=True).count() == 8


def test_it_follows_render_minors_that_two_nodes_swapped(editable_sysfs):
    host = register("gpu-01", editable_sysfs)
    for node, old, new in ((1, 128, 136), (2, 136, 128)):
        properties = editable_sysfs / NODES / str(node) / "properties"
        text = properties.read_text()
        properties.write_text(text.replace(f"drm_render_minor {old}", f"drm_render_minor {new}"))

    summary = services.host_discover(host_id=host.pk)

    assert summary.updated == [1, 2]
    minors = dict(host.gpus.values_list("node_id", "render_minor"))
    assert (minors[1], minors[2]) == (136, 128)


def test_it_adds_a_gpu_that_appears_on_a_new_node(editable_sysfs):
    host = register("gpu-01", editable_sysfs)
    shutil.copytree(editable_sysfs / NODES / "8", editable_sysfs / NODES / "9")
    properties = editable_sysfs / NODES / "9" / "properties"
    properties.write_text(properties.read_text().replace("drm_render_minor 184", "drm_render_minor 192"))

    summary = services.host_discover(host_id=host.pk)

    assert summary.added == [9]
    assert host.gpus.get(node_id=9).render_minor == 192


def test_it_records_why_discovery_failed_on_the_host(editable_sysfs):
    host = register("gpu-01", editable_sysfs)
    (editable_sysfs / NODES / "4" / "properties").write_text("simd_count lots\n")

    with pytest.raises(InventoryError):
        services.host_discover(host_id=host.pk)

    host.refresh_from_db()
    assert host.last_error.startswith("GPU discovery failed: Malformed KFD properties file")
    assert "nodes/4/properties" in host.last_error
    assert host.gpus.filter(is_present=True).count() == 8


def test_it_drains_and_reactivates_a_host(kfd_sysfs_8gpu):
    host = register("gpu-01", kfd_sysfs_8gpu)

    assert services.host_drain(host_id=host.pk).state == GpuHost.State.DRAINING
    assert services.host_activate(host_id=host.pk).state == GpuHost.State.ACTIVE


# --- Engine checks ----------------------------------------------------------------------------------


def test_it_records_when_the_engine_last_answered(kfd_sysfs_8gpu):
    host = register("gpu-01", kfd_sysfs_8gpu, check=False)
    GpuHost.objects.filter(pk=host.pk).update(last_error="old trouble")

    version = services.host_check(host_id=host.pk)

    host.refresh_from_db()
    assert version["ApiVersion"]
    assert host.last_seen_at is not None
    assert host.last_error == ""


def test_it_records_the_error_when_the_engine_stops_answering(kfd_sysfs_8gpu, host_pki):
    host = register("gpu-01", kfd_sysfs_8gpu, check=False)
    engine = unreachable_tls_engine(host_pki)
    url = engine["docker_url"]
    GpuHost.objects.filter(pk=host.pk).update(**engine)

    with pytest.raises(HostUnreachable):
        services.host_check(host_id=host.pk)

    host.refresh_from_db()
    assert host.last_error.startswith(f"Cannot reach the Docker engine at {url}")
    assert host.last_seen_at is None


def test_it_refuses_tls_certificates_for_a_unix_socket():
    with pytest.raises(HostError, match="only apply to tcp://"):
        services.engine_ping(docker_url=LOCAL_ENGINE, tls_ca_cert="-----BEGIN CERTIFICATE-----")


def test_it_refuses_a_client_certificate_without_its_key():
    with pytest.raises(HostError, match="both the TLS client certificate and its key"):
        services.engine_ping(docker_url="tcp://127.0.0.1:2376", tls_client_cert="pem")


# --- Mutual TLS, against a stand-in engine on loopback (host_tls_engine) -----------------------------


def test_it_reaches_an_engine_over_mutual_tls_with_the_hosts_certificates(host_tls_engine):
    version = services.engine_ping(**host_tls_engine)

    assert version["Version"] == "20.10.24-standin"


def test_it_never_connects_to_a_tls_engine_without_a_client_certificate(host_tls_engine):
    without_client_cert = {**host_tls_engine, "tls_client_cert": "", "tls_client_key": ""}

    with pytest.raises(HostError) as error:
        services.engine_ping(**without_client_cert)

    assert not isinstance(error.value, HostUnreachable)
    assert error.value.message.startswith("Refused: TLS without a client certificate.")


def test_it_refuses_an_engine_whose_certificate_our_ca_did_not_sign(host_tls_engine):
    other_ca, _ = issue_certificate("someone else's CA", None, None, ca=True)

    with pytest.raises(HostUnreachable) as error:
        services.engine_ping(**{**host_tls_engine, "tls_ca_cert": pem(other_ca)})

    assert "TLS handshake failed" in error.value.message
    assert "CERTIFICATE_VERIFY_FAILED" in error.value.message


def test_it_keeps_the_client_key_in_a_private_file_only_while_connected(host_tls_engine):
    with services.engine_client(**host_tls_engine) as client:
        cert_path, key_path = client.api.cert
        assert stat.S_IMODE(os.stat(key_path).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(os.path.dirname(key_path)).st_mode) == 0o700
        assert open(key_path).read() == host_tls_engine["tls_client_key"]

    assert not os.path.exists(key_path)
    assert not os.path.exists(cert_path)


def test_it_registers_a_tls_host_and_checks_it_later(host_tls_engine, kfd_sysfs_8gpu):
    # The stand-in engine answers pings only; discovery through a real engine is in test_remote_host.py.
    host = services.host_register(
        name="gpu-tls", private_address="127.0.0.1", sysfs_root=str(kfd_sysfs_8gpu), discover=False, **host_tls_engine
    )

    assert services.host_check(host_id=host.pk)["ApiVersion"] == "1.41"
