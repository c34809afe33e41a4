"""One way to build a Docker Engine API client, shared by host checks and the docker driver."""

import os

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


def has_tls(*, tls_ca_cert: str = "", tls_client_cert: str = "", tls_client_key: str = "") -> bool:
    return bool(tls_ca_cert or tls_client_cert or tls_client_key)


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
    removes. Raises EngineSettingsError when the TLS settings are incomplete or given for a unix socket.
    """
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
