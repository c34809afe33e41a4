"""Each fleet host's engine is a dockerd of its own that answers only over mutual TLS, on its private
address."""

import http.client
import socket
import ssl

import docker
import docker.tls
import pytest
import requests.exceptions

from tests.support.fleet import ENGINE_PORT, CertificateAuthority, _in_netns

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120, func_only=True)]


@pytest.fixture(params=[0, 1], ids=["host-1", "host-2"])
def host(fleet, request):
    return fleet.hosts[request.param]


def client_with(host, tmp_path, *, cert_pem=None, key_pem=None):
    (tmp_path / "ca.pem").write_text(host.tls_ca_cert)
    client_cert = None
    if cert_pem:
        (tmp_path / "cert.pem").write_text(cert_pem)
        (tmp_path / "key.pem").write_text(key_pem)
        client_cert = (str(tmp_path / "cert.pem"), str(tmp_path / "key.pem"))
    tls = docker.tls.TLSConfig(client_cert=client_cert, ca_cert=str(tmp_path / "ca.pem"), verify=True)
    client = docker.DockerClient(base_url=host.docker_url, tls=tls, timeout=10, version="1.41")
    client.api.trust_env = False
    return client


def test_it_answers_the_portals_client_certificate_with_the_hosts_own_engine(fleet, host, tmp_path):
    client = client_with(host, tmp_path, cert_pem=host.tls_client_cert, key_pem=host.tls_client_key)

    info = client.info()

    # Its own engine: its own data root, and not the machine's.
    assert info["DockerRootDir"] == str(host.data_root)
    assert host.docker_url == f"tcp://{host.private_address}:{ENGINE_PORT}"
    assert len({h.private_address for h in fleet.hosts}) == len(fleet.hosts)


def test_it_refuses_a_client_without_a_certificate(host, tmp_path):
    client = client_with(host, tmp_path)

    with pytest.raises(requests.exceptions.ConnectionError):
        client.version()


def test_it_refuses_a_client_certificate_from_another_ca(host, tmp_path):
    stranger = CertificateAuthority.create("someone else's CA")
    stranger_cert, stranger_key = stranger.issue("portal", client=True)
    client = client_with(host, tmp_path, cert_pem=stranger_cert, key_pem=stranger_key)

    with pytest.raises(requests.exceptions.ConnectionError):
        client.version()


def test_it_refuses_plain_http(host):
    connection = http.client.HTTPConnection(host.private_address, ENGINE_PORT, timeout=10)
    try:
        connection.request("GET", "/version")
        response = connection.getresponse()
        status, body = response.status, response.read()
    except (ConnectionError, http.client.HTTPException) as error:
        status, body = None, str(error).encode()
    finally:
        connection.close()

    assert status != 200
    assert b"ApiVersion" not in body


def test_it_refuses_tls_to_a_client_that_does_not_trust_the_fleet_ca(host):
    # The engine's certificate is the fleet CA's, for its private address: a client that checks it
    # against the system's CAs does not talk to the engine at all.
    context = ssl.create_default_context()
    with socket.create_connection((host.private_address, ENGINE_PORT), timeout=10) as raw:
        with pytest.raises(ssl.SSLCertVerificationError):
            context.wrap_socket(raw, server_hostname=host.private_address)


def test_it_listens_with_dockerd_only_on_the_tls_port_of_the_private_address(host):
    listening = _in_netns(host.netns, "ss", "-Hltnp").stdout.splitlines()

    dockerd_sockets = {line.split()[3] for line in listening if '"dockerd"' in line}

    assert dockerd_sockets == {f"{host.private_address}:{ENGINE_PORT}"}
