"""Adding a host refuses engines that anyone on the network could drive, and sockets that are not this machine.

Each engine here is this machine's real dockerd behind a loopback port, so before these rules the check
answered and the host was saved: the portal would then launch tenants next to an engine they can reach.
"""

import html

import pytest

from provisioning import services
from provisioning.models import GpuHost
from tests.conftest import make_staff

from .test_hosts import LOCAL_ENGINE
from .test_hosts_admin import ADD_URL, host_form

pytestmark = pytest.mark.django_db

PLAIN_TCP_REFUSED = (
    "Refused: {url} has no TLS. A Docker engine on plain TCP obeys anyone who reaches its port, a "
    "tenant's container included, and that is root on the host. Run dockerd with --tlsverify, and give "
    "its CA and the portal's client certificate and key."
)
NO_CLIENT_CERTIFICATE_REFUSED = (
    "Refused: TLS without a client certificate. An engine that takes clients without one (dockerd "
    "without --tlsverify) obeys anyone who reaches {url}, so they own the host. Give the portal's client "
    "certificate and key, and run dockerd with --tlsverify."
)
FOREIGN_SOCKET_REFUSED = (
    "Refused: a unix:// socket reaches the Docker engine of the machine the portal and its worker run on, "
    "so it can only register this machine, and 10.200.0.7 is not one of its addresses. Register another "
    "machine as tcp://<its address>:2376 with mutual TLS."
)


def page_text(response) -> str:
    """The page as the operator reads it (entities such as &#x27; turned back into characters)."""
    return html.unescape(response.content.decode())


@pytest.fixture
def host_adder(client, db):
    """An operator who may add GPU hosts (and nothing else), logged in to the admin."""
    operator = make_staff("hana@ops.example.com", "provisioning.add_gpuhost", "provisioning.view_gpuhost")
    client.force_login(operator)
    return client


def test_it_refuses_an_engine_on_plain_tcp_posted_in_the_admin(host_adder, host_engine_plain_tcp):
    response = host_adder.post(
        ADD_URL, host_form(docker_url=host_engine_plain_tcp, private_address="127.0.0.1")
    )

    assert response.status_code == 200
    assert PLAIN_TCP_REFUSED.format(url=host_engine_plain_tcp) in page_text(response)
    assert not GpuHost.objects.exists()


def test_it_refuses_tls_without_a_client_certificate_posted_in_the_admin(host_adder, host_engine_tls_any_client):
    response = host_adder.post(
        ADD_URL, host_form(**host_engine_tls_any_client, tls_client_cert="", private_address="127.0.0.1")
    )

    assert response.status_code == 200
    url = host_engine_tls_any_client["docker_url"]
    assert NO_CLIENT_CERTIFICATE_REFUSED.format(url=url) in page_text(response)
    assert not GpuHost.objects.exists()


def test_it_refuses_this_machines_socket_posted_for_another_machine(host_adder):
    response = host_adder.post(ADD_URL, host_form(docker_url=LOCAL_ENGINE, private_address="10.200.0.7"))

    assert response.status_code == 200
    assert FOREIGN_SOCKET_REFUSED in page_text(response)
    assert not GpuHost.objects.exists()


def test_it_refuses_to_register_an_engine_on_plain_tcp(host_engine_plain_tcp):
    with pytest.raises(services.HostError) as refused:
        services.host_register(name="gpu-plain", docker_url=host_engine_plain_tcp, discover=False)

    assert refused.value.message == PLAIN_TCP_REFUSED.format(url=host_engine_plain_tcp)
    assert not GpuHost.objects.exists()


def test_it_refuses_to_register_tls_without_a_client_certificate(host_engine_tls_any_client):
    with pytest.raises(services.HostError) as refused:
        services.host_register(name="gpu-anyclient", discover=False, **host_engine_tls_any_client)

    url = host_engine_tls_any_client["docker_url"]
    assert refused.value.message == NO_CLIENT_CERTIFICATE_REFUSED.format(url=url)
    assert not GpuHost.objects.exists()


def test_it_refuses_to_register_this_machines_socket_for_another_machine():
    with pytest.raises(services.HostError) as refused:
        services.host_register(
            name="gpu-07", docker_url=LOCAL_ENGINE, private_address="10.200.0.7", discover=False
        )

    assert refused.value.message == FOREIGN_SOCKET_REFUSED
    assert not GpuHost.objects.exists()


def test_it_registers_an_engine_behind_mutual_tls_with_its_private_address(host_engine_mtls):
    host = services.host_register(
        name="gpu-mtls", private_address="127.0.0.1", discover=False, **host_engine_mtls
    )

    assert host.private_address == "127.0.0.1"
    assert host.last_seen_at is not None


def test_it_asks_a_tcp_host_for_the_private_address_jupyterlab_is_published_on(host_engine_mtls):
    with pytest.raises(services.HostError) as refused:
        services.host_register(name="gpu-noaddress", discover=False, **host_engine_mtls)

    assert "Give the host's private address" in refused.value.message
    with pytest.raises(services.HostError) as refused:
        services.host_register(name="gpu-any", private_address="0.0.0.0", discover=False, **host_engine_mtls)

    assert "0.0.0.0 is every address of the host" in refused.value.message
    assert not GpuHost.objects.exists()
