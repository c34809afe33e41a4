"""One way to build a Docker Engine API client, shared by host checks and the docker driver."""

import ipaddress
import os
import socket
from urllib.parse import urlparse

import docker
import docker.errors
import docker.tls

# The API version spoken to every host: 1.41 is Docker 20.10, the oldest engine supported; newer engines
# still serve it. A fixed version also means the client constructor sends no request (see build_client).
DOCKER_API_VERSION = "1.41"


class EngineSettingsError(ValueError):
    """The host's endpoint or TLS settings are incomplete or contradictory; retrying cannot help."""


def _write_private(directory: str, name: str, text: str) -> str:
    path = os.path.join(directory, name)
    # 0600 from the start: the client key must never be readable by another user, even briefly.
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(text)
    return path


def host_tls(host) -> dict:
    """The host's TLS settings as build_client takes them, its client key unsealed.

    Raises EngineSettingsError when the stored key cannot be opened with this portal's sealing key."""
    from portal.lib.sealed import Unreadable

    try:
        key = host.tls_client_key
    except Unreadable as error:
        raise EngineSettingsError(
            f"The TLS client key of host {host.name} cannot be read: it was sealed with a key this portal "
            "does not have (DEVCLOUD_SEALING_KEY or SECRET_KEY changed). Put the key it was sealed with "
            "after the new one in DEVCLOUD_SEALING_KEY, or paste the client key again on the host's page."
        ) from error
    return {"tls_ca_cert": host.tls_ca_cert, "tls_client_cert": host.tls_client_cert, "tls_client_key": key}


def has_tls(*, tls_ca_cert: str = "", tls_client_cert: str = "", tls_client_key: str = "") -> bool:
    return bool(tls_ca_cert or tls_client_cert or tls_client_key)


def is_local_engine(docker_url: str) -> bool:
    """True for a unix:// socket: an engine on the machine this code runs on, whose files it can read."""
    return docker_url.startswith("unix://")


def refuse_insecure_endpoint(
    *, docker_url: str, tls_ca_cert: str = "", tls_client_cert: str = "", tls_client_key: str = ""
) -> None:
    """Refuse an engine anyone on its network could drive. Returns None for unix:// and mutual TLS.

    An engine is root on its host. Reached over plain TCP, or over TLS that takes clients without a
    certificate (dockerd without --tlsverify), it obeys whoever reaches its port, and the tenants'
    containers sit on the same network. Raises EngineSettingsError saying so, and for other schemes.
    """
    scheme = urlparse(docker_url).scheme
    if scheme == "unix":
        return
    if scheme != "tcp":
        raise EngineSettingsError(
            f"Refused: {docker_url} is neither unix:// (this machine's engine) nor tcp:// with mutual TLS."
        )
    if not tls_client_cert:
        if not (tls_ca_cert or tls_client_key):
            raise EngineSettingsError(
                f"Refused: {docker_url} has no TLS. A Docker engine on plain TCP obeys anyone who reaches "
                "its port, a tenant's container included, and that is root on the host. Run dockerd with "
                "--tlsverify, and give its CA and the portal's client certificate and key."
            )
        raise EngineSettingsError(
            "Refused: TLS without a client certificate. An engine that takes clients without one (dockerd "
            f"without --tlsverify) obeys anyone who reaches {docker_url}, so they own the host. Give the "
            "portal's client certificate and key, and run dockerd with --tlsverify."
        )


def is_this_machines_address(address: str) -> bool:
    """True when `address` is loopback or assigned to one of this machine's interfaces."""
    ip = ipaddress.ip_address(address)
    if ip.is_loopback:
        return True
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    # Binding succeeds only to an address the machine has (EADDRNOTAVAIL otherwise); nothing is sent.
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        try:
            probe.bind((address, 0))
        except OSError:
            return False
    return True


def private_address_for(*, docker_url: str, private_address: str | None) -> str:
    """The address the host's containers publish JupyterLab on. Returns it ("127.0.0.1" when a local
    engine is given none).

    Raises EngineSettingsError when a tcp:// host has none, when it is 0.0.0.0 or :: (every address of
    the host, its public side included), or when a unix:// host is given an address that is not this
    machine's: a unix socket only ever reaches this machine's engine, whatever host it is registered as.
    """
    address = (private_address or "").strip()
    if address:
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            raise EngineSettingsError(f"{address} is not an IP address.") from None
        if ip.is_unspecified or ip.is_multicast:
            raise EngineSettingsError(
                f"{address} is every address of the host: give the one private address where JupyterLab "
                "may be published and the gateway reaches it."
            )
        address = str(ip)
    if is_local_engine(docker_url):
        if not address:
            return "127.0.0.1"
        if not is_this_machines_address(address):
            raise EngineSettingsError(
                "Refused: a unix:// socket reaches the Docker engine of the machine the portal and its "
                f"worker run on, so it can only register this machine, and {address} is not one of its "
                "addresses. Register another machine as tcp://<its address>:2376 with mutual TLS."
            )
        return address
    if not address:
        raise EngineSettingsError(
            "Give the host's private address: its containers publish JupyterLab only there, and the "
            "gateway reaches them there (never on the host's public address)."
        )
    return address


def build_client(
    *,
    docker_url: str,
    timeout: float,
    pem_dir: str | None = None,
    tls_ca_cert: str = "",
    tls_client_cert: str = "",
    tls_client_key: str = "",
) -> docker.DockerClient:
    """A docker.DockerClient for one engine. Sends nothing until it is used.

    With TLS settings, the PEM texts are written (0600) into `pem_dir`, which the caller owns and
    removes. Raises EngineSettingsError when the TLS settings are incomplete or given for a unix socket,
    and for an engine anyone could drive (refuse_insecure_endpoint): a host saved before that rule, or
    written to the database by hand, is never reached that way either.
    """
    refuse_insecure_endpoint(
        docker_url=docker_url,
        tls_ca_cert=tls_ca_cert,
        tls_client_cert=tls_client_cert,
        tls_client_key=tls_client_key,
    )
    tls = None
    if has_tls(tls_ca_cert=tls_ca_cert, tls_client_cert=tls_client_cert, tls_client_key=tls_client_key):
        if not docker_url.startswith("tcp://"):
            raise EngineSettingsError(f"TLS certificates only apply to tcp:// endpoints, not {docker_url}.")
        if bool(tls_client_cert) != bool(tls_client_key):
            raise EngineSettingsError("Give both the TLS client certificate and its key, or neither.")
        if pem_dir is None:
            raise ValueError("pem_dir is required when TLS settings are given")
        client_cert = None
        if tls_client_cert:
            client_cert = (
                _write_private(pem_dir, "cert.pem", tls_client_cert),
                _write_private(pem_dir, "key.pem", tls_client_key),
            )
        ca_cert = _write_private(pem_dir, "ca.pem", tls_ca_cert) if tls_ca_cert else None
        try:
            # Always verify the engine: against the given CA, or the system's CAs when none is given.
            tls = docker.tls.TLSConfig(client_cert=client_cert, ca_cert=ca_cert, verify=ca_cert or True)
        except docker.errors.TLSParameterError as error:
            raise EngineSettingsError(f"Bad TLS settings for {docker_url}: {error}") from error
    client = docker.DockerClient(base_url=docker_url, tls=tls, timeout=timeout, version=DOCKER_API_VERSION)
    # Off before the first request: otherwise REQUESTS_CA_BUNDLE (and proxy variables) from the
    # environment silently replace the host's own CA, and every TLS engine fails verification.
    client.api.trust_env = False
    return client
