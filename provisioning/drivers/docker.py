"""Instances as hardened containers on a host's Docker engine (local socket, or TCP with TLS).

Per instance the driver makes, all named and labelled after the instance so a retry finds them:
  container  devcloud-<instance uuid>      JupyterLab; /dev/kfd and only its own GPUs' render nodes
  network    devcloud-net-<instance uuid>  a bridge of its own, so tenants cannot reach each other
and per user a volume <portal id>-ws-<user id> at /workspace, kept when the instance stops. The volume
lives on one host at a time and follows its owner: start moves it here first when it is elsewhere
(provisioning/workspaces.py).

Everything the reconciler needs is in the labels: devcloud.managed, devcloud.portal (portals sharing an
engine never touch each other's), devcloud.instance, devcloud.user, devcloud.gpus.
"""

import io
import logging
import os
import shutil
import tempfile
import threading
import time
import weakref

import docker
import docker.errors
import docker.tls
import requests.exceptions
from django.conf import settings
from docker.types import Mount

from portal.instances.catalog import CatalogError, load_catalog

from ..engine import EngineSettingsError, build_client, has_tls
from ..start_slots import Cancelled, Line, slots_for
from .base import (
    Driver,
    DriverError,
    PollResult,
    StartResult,
    authorized_keys_text,
    hide_token,
    jupyter_base_url,
)

logger = logging.getLogger(__name__)

JUPYTER_PORT = 8888
# sshd inside (containers/entrypoint/start-jupyter.sh runs it as uid 1000); published like JupyterLab's port.
SSH_PORT = 2222
# Where the owner's public keys go: sshd's AuthorizedKeysFile (.ssh/authorized_keys) of the instance user.
SSH_DIR = "/home/developer/.ssh"
CONTAINER_USER = "1000:1000"
WORKSPACE = "/workspace"
# Seconds `docker stop` waits for JupyterLab to exit on SIGTERM before SIGKILL; it needs about one.
STOP_TIMEOUT = 5
# Builds and pulls stream for minutes with silent steps; ordinary API calls get the shorter timeout.
BUILD_TIMEOUT = 3600
GIB = 1024**3
# /dev/shm gets half the memory limit (PyTorch data loaders live there), but no more than this.
MAX_SHM_BYTES = 64 * GIB
# Seconds to wait for the network or container a concurrent start of the same instance is making.
RACE_WAIT_SECONDS = 5
# How long a worker trusts the CPU count it read from an engine. `info` is one of the engine's slower
# calls, and every start needs the count (a container cannot be given more CPUs than its engine has); it
# changes only when the machine does, so a burst of starts reads it once.
ENGINE_CPUS_SECONDS = 60.0
_engine_cpus: dict[str, tuple[float, int]] = {}
_engine_cpus_lock = threading.Lock()


def api_timeout() -> int:
    # Seconds for one Docker API call. A hung engine must fail the task (transiently), not hang it.
    return getattr(settings, "DEVCLOUD_DOCKER_TIMEOUT", 30)


def pids_per_gpu() -> int:
    # Processes and threads a container may have, per GPU: stops a fork bomb from taking the host down.
    return getattr(settings, "DEVCLOUD_PIDS_PER_GPU", 4096)


def portal_id() -> str:
    return settings.DEVCLOUD_PORTAL_ID


def container_name(instance) -> str:
    return f"devcloud-{instance.id}"


def network_name(instance) -> str:
    return f"devcloud-net-{instance.id}"


def volume_name(user_id) -> str:
    # Prefixed with the portal id ("devcloud" by default, giving devcloud-ws-<user id>): two portals on
    # one engine have users with the same ids, and must never share a workspace.
    return f"{portal_id()}-ws-{user_id}"


def volume_labels(user_id) -> dict[str, str]:
    # devcloud.user lets account deletion find the person's volumes on every host.
    return {"devcloud.managed": "true", "devcloud.portal": portal_id(), "devcloud.user": str(user_id)}


def instance_labels(instance, gpus=()) -> dict[str, str]:
    return {
        "devcloud.managed": "true",
        "devcloud.portal": portal_id(),
        "devcloud.instance": str(instance.id),
        "devcloud.user": str(instance.user_id),
        "devcloud.gpus": ",".join(str(gpu.render_minor) for gpu in gpus),
    }


def engine_cpu_count(client) -> int:
    """The engine's CPU count, read at most once per ENGINE_CPUS_SECONDS per engine address."""
    key = client.api.base_url
    now = time.monotonic()
    with _engine_cpus_lock:
        known = _engine_cpus.get(key)
    if known is not None and known[0] > now:
        return known[1]
    cpus = client.info().get("NCPU") or 1
    with _engine_cpus_lock:
        _engine_cpus[key] = (now + ENGINE_CPUS_SECONDS, cpus)
    return cpus


class DockerDriver(Driver):
    """Runs instances on `host`'s Docker engine. See base.Driver for the contract of each method."""

    name = "docker"
    isolates_gpus = True

    def __init__(self, host):
        super().__init__(host)
        self._clients = {}
        self._tls_dir = None

    # --- Engine connection ------------------------------------------------------------------------

    @property
    def is_local_engine(self) -> bool:
        """True when the engine runs on this machine (a unix socket), so its /dev can be looked at here."""
        return self.host.docker_url.startswith("unix://")

    def publish_address(self) -> str:
        """Where containers publish their ports, and where the gateway reaches them: the host's private
        address (127.0.0.1 for this machine's engine), never 0.0.0.0.

        Raises DriverError(permanent=True) for a remote host without one (saved before it was asked for).
        """
        if self.host.private_address:
            return self.host.private_address
        if self.is_local_engine:
            return "127.0.0.1"
        raise DriverError(
            f"Host {self.host.name} has no private address, and its containers would otherwise publish "
            "JupyterLab on every address it has. An operator should set it on the host's page.",
            permanent=True,
        )

    def client(self, *, timeout: int | None = None) -> docker.DockerClient:
        """A client for the host's engine. Raises DriverError(permanent=True) for bad TLS settings."""
        timeout = timeout or api_timeout()
        if timeout not in self._clients:
            host = self.host
            tls = dict(
                tls_ca_cert=host.tls_ca_cert, tls_client_cert=host.tls_client_cert, tls_client_key=host.tls_client_key
            )
            if self._tls_dir is None and has_tls(**tls):
                # The SDK wants files. Private ones, removed with the driver.
                self._tls_dir = tempfile.mkdtemp(prefix="devcloud-tls-")
                weakref.finalize(self, shutil.rmtree, self._tls_dir, True)
            # A directory per client: a second client (a pull's longer timeout) must not trip over the
            # files the first one wrote, which build_client creates exclusively.
            pem_dir = tempfile.mkdtemp(dir=self._tls_dir) if self._tls_dir else None
            try:
                self._clients[timeout] = build_client(
                    docker_url=host.docker_url, timeout=timeout, pem_dir=pem_dir, **tls
                )
            except EngineSettingsError as error:
                raise DriverError(
                    f"Host {host.name} has unusable TLS settings: {error} Fix them in the admin console.",
                    permanent=True,
                ) from error
            except docker.errors.DockerException as error:
                raise self._unreachable(error) from error
        return self._clients[timeout]

    def _unreachable(self, error) -> DriverError:
        return DriverError(
            f"The Docker engine of host {self.host.name} ({self.host.docker_url}) cannot be reached: "
            f"{_reason(error)}. "
            "This is usually temporary; if it lasts, check that dockerd runs on that host.",
            permanent=False,
        )

    def _api_error(self, error, doing: str) -> DriverError:
        """Turns an SDK exception into a DriverError that says whether retrying can help.

        Anything that is not an engine failure (a bug) is re-raised as it is.
        """
        if isinstance(error, DriverError):
            return error
        if isinstance(error, (requests.exceptions.ConnectionError, requests.exceptions.Timeout)):
            return self._unreachable(error)
        if isinstance(error, docker.errors.APIError):
            explanation = str(error.explanation or error)
            lowered = explanation.lower()
            if "device" in lowered and ("no such file" in lowered or "error gathering device" in lowered):
                return DriverError(
                    f"A GPU device is missing on host {self.host.name} while {doing}: {explanation}. "
                    "An operator should rediscover the host's GPUs or drain it.",
                    permanent=True,
                )
            if "address pool" in lowered or "non-overlapping" in lowered:
                return DriverError(
                    f"Host {self.host.name} has no network addresses left for a new instance network "
                    f"({explanation}). An operator should remove stale devcloud-net-* networks or "
                    "configure dockerd's default-address-pools.",
                    permanent=True,
                )
            if error.status_code and error.status_code >= 500:
                return DriverError(
                    f"The Docker engine of host {self.host.name} failed while {doing}: {explanation}",
                    permanent=False,
                )
            return DriverError(
                f"The Docker engine of host {self.host.name} refused {doing}: {explanation}", permanent=True
            )
        if isinstance(error, docker.errors.DockerException):
            return self._unreachable(error)
        raise error

    # --- The contract -----------------------------------------------------------------------------

    def start(self, instance, gpus, progress=None, turn=None) -> StartResult:
        """Starts the instance's container with exactly `gpus` and returns its endpoint and state.

        Before the container is made, the owner's workspace is brought here from the host that holds it
        (provisioning/workspaces.py); `progress(message)` gets the lines to show on the instance's timeline
        while it moves. Idempotent: an existing container for the instance is started if needed and reused
        (or replaced, when it was made for other GPUs). Raises DriverError(permanent=True) for a missing
        image or device, or a workspace that did not arrive whole, DriverError(permanent=False) when the
        engine cannot be reached or times out.
        """
        from .. import workspaces

        gpus = sorted(gpus, key=lambda gpu: gpu.render_minor)
        client = self.client()
        name = container_name(instance)
        try:
            container = self._find_container(client, name)
            if (
                container is not None
                and container.labels.get("devcloud.gpus") != instance_labels(instance, gpus)["devcloud.gpus"]
            ):
                # Made by an earlier attempt with another allocation: never hand it GPUs it no longer holds.
                container.remove(force=True)
                container = None
            network = self._ensure_network(client, instance)
            if container is None:
                workspaces.workspace_prepare(driver=self, instance=instance, progress=progress)
            volume = self._ensure_volume(client, instance)
            if container is None:
                container = self._create_container(client, instance, gpus, network.name, volume.name)
                workspaces.workspace_created(user_id=instance.user_id, host=self.host, volume=volume.name)
                # Before the first start, so sshd trusts the owner's keys from its first connection.
                self._put_authorized_keys(container, authorized_keys_text(instance.user_id))
            if container.status != "running":
                # The network, workspace and container are made before the instance's turn, so that
                # once its start slot frees only the start itself is left.
                if turn is not None:
                    turn()
                container.start()
            container.reload()
            endpoint, host_port = self._endpoint(container)
            ssh_port = self._published_port(container, SSH_PORT)
        except DriverError as error:
            if error.permanent:
                self._discard(client, instance)
            raise
        except Cancelled:
            raise  # called off while waiting its turn: the caller removes what was made
        except Exception as error:
            driver_error = self._api_error(error, f"starting {name}")
            if driver_error.permanent:
                self._discard(client, instance)
            raise driver_error from error
        return StartResult(
            endpoint=endpoint,
            state={
                "container_id": container.id,
                "container_name": name,
                "network": network.name,
                "volume": volume.name,
                "host_port": host_port,
                # sshd's port on the same address as the endpoint; None for an image from before SSH.
                "ssh_port": ssh_port,
                "image": instance.image.reference,
                "gpus": [gpu.render_minor for gpu in gpus],
            },
        )

    def stop(self, instance) -> None:
        """Stops and removes the container and its network; keeps the workspace volume. Missing is fine.

        Raises DriverError(permanent=False) when the engine cannot be reached.
        """
        client = self.client()
        name = container_name(instance)
        try:
            container = self._find_container(client, name)
            if container is not None:
                if container.status == "running":
                    container.stop(timeout=STOP_TIMEOUT)
                container.remove(force=True, v=False)
            self._remove_networks(client, instance)
        except docker.errors.NotFound:
            # Removed by someone else between our look and our remove: already stopped.
            self._remove_networks(client, instance)
        except Exception as error:
            raise self._api_error(error, f"stopping {name}") from error

    def poll(self, instance) -> PollResult:
        """What the engine shows of the instance: running, exited (with its exit code) or missing."""
        client = self.client()
        try:
            container = self._find_container(client, container_name(instance))
        except Exception as error:
            raise self._api_error(error, "looking at the container") from error
        if container is None:
            return PollResult(status="missing")
        state = container.attrs.get("State", {})
        if container.status in ("running", "restarting", "paused"):
            return PollResult(status="running", detail=container.status)
        detail = state.get("Error") or ""
        if state.get("OOMKilled"):
            detail = "killed for running out of memory"
        elif container.status == "created":
            detail = "created but never started"
        return PollResult(status="exited", exit_code=state.get("ExitCode"), detail=detail)

    def managed_instance_ids(self) -> set[str]:
        """Instance ids of every container this portal manages on the host, running or not."""
        client = self.client()
        try:
            containers = client.containers.list(
                all=True, sparse=True, filters={"label": self._portal_filter()}
            )
        except Exception as error:
            raise self._api_error(error, "listing containers") from error
        return {c.attrs.get("Labels", {}).get("devcloud.instance") for c in containers} - {None}

    def remove_workspace(self, instance) -> None:
        """Removes the owner's workspace volume on this host. Missing is fine; a volume another container
        still mounts is left for provisioning.workspaces' removal rows to retry. Raises
        DriverError(permanent=False) when the engine cannot be reached."""
        try:
            self.client().volumes.get(volume_name(instance.user_id)).remove()
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as error:
            if error.status_code != 409:
                raise self._api_error(error, "removing the workspace") from error
            logger.info("Workspace of user %s on %s is still in use", instance.user_id, self.host.name)
        except Exception as error:
            raise self._api_error(error, "removing the workspace") from error

    def logs(self, instance, tail: int = 100) -> str:
        """The last `tail` lines of the container's output (stdout and stderr), for the operator console.

        The instance's Jupyter token is blanked out wherever JupyterLab printed it (its startup banner
        prints URLs with the token): operators do not get a way into a user's JupyterLab. Returns ""
        when the container does not exist (never started, or removed at stop). Raises
        DriverError(permanent=False) when the engine cannot be reached.
        """
        try:
            container = self._find_container(self.client(), container_name(instance))
            if container is None:
                return ""
            text = container.logs(stdout=True, stderr=True, tail=tail).decode("utf-8", errors="replace")
        except docker.errors.NotFound:
            return ""  # removed between the look and the read
        except Exception as error:
            raise self._api_error(error, "reading the container's log") from error
        return hide_token(text, instance.jupyter_token)

    def start_line(self):
        """One line per engine address, with as many start slots as its CPUs allow (start_slots.slots_for)."""
        client = self.client()
        try:
            cpus = engine_cpu_count(client)
        except Exception as error:
            raise self._api_error(error, "reading the engine's CPU count") from error
        return Line(engine=client.api.base_url, limit=slots_for(cpus))

    watches_output = True

    def wait_for_output(self, instance, text: str, deadline: float, cancelled) -> bool:
        """Follows the container's output (the engine's log stream: no polling) until a line contains
        `text`; see Driver. The stream is closed from a helper thread at the deadline or on `cancelled`."""
        try:
            container = self._find_container(self.client(), container_name(instance))
            if container is None:
                return False
            stream = container.logs(stdout=True, stderr=True, stream=True, follow=True)
        except docker.errors.NotFound:
            return False
        except Exception as error:
            raise self._api_error(error, "following the container's output") from error
        finished = threading.Event()

        def close_when_due():
            while not finished.wait(0.5):
                if cancelled.is_set() or time.monotonic() >= deadline:
                    break
            stream.close()

        threading.Thread(target=close_when_due, name="output-deadline", daemon=True).start()
        needle, tail = text.encode(), b""
        try:
            for chunk in stream:
                seen = tail + chunk
                if needle in seen:
                    return True
                tail = seen[-len(needle) :]
        except Exception:
            # Closed at the deadline, or the engine went away: the caller's poll says which.
            return False
        finally:
            finished.set()
        return False

    # --- Images (operator actions) ----------------------------------------------------------------

    def images(self) -> list[str]:
        """Every image tag present on the host, sorted.

        Raises DriverError(permanent=False) when the engine cannot be reached.
        """
        try:
            images = self.client().images.list()
        except Exception as error:
            raise self._api_error(error, "listing images") from error
        return sorted(tag for image in images for tag in image.tags)

    def has_image(self, reference: str) -> bool:
        try:
            self.client().images.get(reference)
            return True
        except docker.errors.ImageNotFound:
            return False
        except Exception as error:
            raise self._api_error(error, "looking for an image") from error

    def ensure_image(
        self, reference: str, build_context: str = "", *, progress=None, catalog_path=None
    ) -> str:
        """Makes `reference` present on the host, so a launch never waits on a download.

        Returns "present" when it already was, "built" after building it from the catalogue's
        `build_context` (a directory next to the catalogue, containers/ unless `catalog_path` says
        otherwise), or "pulled" after pulling it when there is no build context. `progress(line)` is
        called with each line of build or pull output.
        Raises DriverError: permanent=True when the build fails or the catalogue no longer produces
        `reference` (run `manage.py sync_images`), permanent=False when the engine cannot be reached.
        """
        report = progress or (lambda line: None)
        if self.has_image(reference):
            report(f"{reference} is already on {self.host.name}")
            return "present"
        if build_context and on_a_registry(reference):
            # A fleet serves its images from a registry: pulling is faster than building on each host,
            # and needs no local base there. The build is the fallback.
            try:
                self._pull(reference, report)
                return "pulled"
            except DriverError as error:
                report(f"{error.message} Building it instead.")
        if build_context:
            self._build(reference, build_context, report, catalog_path)
            return "built"
        self._pull(reference, report)
        return "pulled"

    def _build(self, reference: str, build_context: str, report, catalog_path) -> None:
        try:
            catalog = load_catalog(catalog_path)
            key = catalog.key_for_context(build_context)
            expected = catalog.reference(key)
            # Under IMAGE_REGISTRY the catalogue names the same build by its registry reference.
            registry_expected = catalog.reference(key, registry=getattr(settings, "IMAGE_REGISTRY", ""))
        except CatalogError as error:
            raise DriverError(str(error), permanent=True) from error
        if reference not in (expected, registry_expected):
            raise DriverError(
                f"The catalogue now builds {key} as {expected}, not {reference}: its files changed since "
                "the last sync. Run `manage.py sync_images`, then build again.",
                permanent=True,
            )
        base = catalog.base_reference(key)
        if base and not self.has_image(base):
            raise DriverError(
                f"{reference} builds FROM the local Debian base {base}, which host {self.host.name} does "
                "not have. Run scripts/build-images.sh on that host (as root, with debootstrap installed).",
                permanent=True,
            )
        report(f"building {reference} on {self.host.name}")
        client = self.client(timeout=BUILD_TIMEOUT)
        try:
            for chunk in client.api.build(
                fileobj=io.BytesIO(catalog.build_context(key)),
                custom_context=True,
                tag=reference,
                buildargs=catalog.build_args(key),
                labels={"devcloud.image": key},
                rm=True,
                forcerm=True,
                decode=True,
            ):
                if "error" in chunk:
                    raise DriverError(
                        f"Building {reference} failed: {chunk['error'].strip()}", permanent=True
                    )
                line = (chunk.get("stream") or chunk.get("status") or "").rstrip()
                if line:
                    report(line)
        except DriverError:
            raise
        except Exception as error:
            raise self._api_error(error, f"building {reference}") from error
        report(f"built {reference}")

    def _pull(self, reference: str, report) -> None:
        report(f"pulling {reference} on {self.host.name}")
        repository, _, tag = (
            reference.rpartition(":") if ":" in reference.rsplit("/", 1)[-1] else (reference, "", "latest")
        )
        client = self.client(timeout=BUILD_TIMEOUT)
        layers = PullProgress()
        try:
            for chunk in client.api.pull(repository, tag=tag, stream=True, decode=True):
                if "error" in chunk:
                    raise DriverError(f"Pulling {reference} failed: {chunk['error']}", permanent=True)
                line = " ".join(filter(None, (chunk.get("id"), chunk.get("status"), chunk.get("progress"))))
                if line:
                    report(line)
                percent = layers.update(chunk)
                if percent is not None:
                    report(f"Pull {percent}% of {reference}")
        except DriverError:
            raise
        except docker.errors.NotFound as error:
            raise DriverError(
                f"{reference} is not in its registry: {_reason(error)}", permanent=True
            ) from error
        except Exception as error:
            raise self._api_error(error, f"pulling {reference}") from error
        report(f"pulled {reference}")

    # --- Pieces -----------------------------------------------------------------------------------

    def _portal_filter(self) -> list[str]:
        return ["devcloud.managed=true", f"devcloud.portal={portal_id()}"]

    @staticmethod
    def _find_container(client, name):
        try:
            return client.containers.get(name)
        except docker.errors.NotFound:
            return None

    def _ensure_network(self, client, instance):
        name = network_name(instance)
        try:
            return client.networks.get(name)
        except docker.errors.NotFound:
            pass
        try:
            # The low-level call: the SDK's networks.create inspects the new network again, one more
            # engine call per launch that tells nothing the caller uses (it needs the name and id).
            made = client.api.create_network(
                name,
                driver="bridge",
                check_duplicate=True,
                labels=instance_labels(instance),
                options={
                    # A recognisable interface name ("dc-" + the start of the uuid, within Linux's 15
                    # characters), so a host firewall can match every instance bridge with `-i dc-+`.
                    "com.docker.network.bridge.name": f"dc-{instance.id.hex[:12]}",
                },
            )
            return client.networks.prepare_model({"Id": made["Id"], "Name": name})
        except docker.errors.APIError as error:
            # A concurrent attempt (a redelivered task, or the reconciler's resume) made it first. The
            # engine's name check is not atomic: a racer that got past it is refused for the bridge
            # name instead (403).
            if error.status_code != 409 and "same bridge name" not in str(error.explanation or ""):
                raise
        return self._made_by_other_attempt(client.networks.get, name)

    def _remove_networks(self, client, instance):
        # By label as well as name: an engine that ignored check_duplicate may hold two of them.
        networks = client.networks.list(
            filters={"label": [f"devcloud.instance={instance.id}", f"devcloud.portal={portal_id()}"]}
        )
        for network in networks:
            try:
                network.remove()
            except docker.errors.NotFound:
                pass

    def _ensure_volume(self, client, instance):
        name = volume_name(instance.user_id)
        try:
            return client.volumes.get(name)
        except docker.errors.NotFound:
            # Creating an existing volume returns it, so a concurrent create is harmless.
            return client.volumes.create(name, labels=volume_labels(instance.user_id))

    def _device_paths(self, gpus) -> list[tuple[str, str]]:
        """(host path, container path) of /dev/kfd and each GPU's render node; empty without GPUs."""
        if not gpus:
            return []
        root = self.host.dev_root or "/"
        pairs = [(os.path.join(root, "dev/kfd"), "/dev/kfd")]
        pairs += [
            (os.path.join(root, f"dev/dri/renderD{gpu.render_minor}"), f"/dev/dri/renderD{gpu.render_minor}")
            for gpu in gpus
        ]
        return pairs

    def _device_groups(self, device_paths, gpus) -> list[str]:
        """Group ids that own the device nodes, so uid 1000 may open them (never group 0, root's).

        This machine's engine: read from the nodes now (a missing node fails the start for good). Any
        other host: the gids discovery read on that host through its engine (GpuHost.kfd_gid,
        Gpu.render_gid), since its /dev cannot be looked at from here. Raises DriverError(permanent=True)
        when a node is missing, or when a remote host's gids were never discovered (the container could
        not open its GPU).
        """
        if not device_paths:
            return []
        if not self.is_local_engine:
            gids = {self.host.kfd_gid, *(gpu.render_gid for gpu in gpus)}
            if None in gids:
                raise DriverError(
                    f"The group ids of host {self.host.name}'s GPU device nodes are not known, so uid 1000 "
                    "could not open its GPU. An operator should run Discover GPUs on the host.",
                    permanent=True,
                )
            return [str(gid) for gid in sorted(gids - {0})]
        gids = set()
        for host_path, _ in device_paths:
            try:
                gids.add(os.stat(host_path).st_gid)
            except FileNotFoundError:
                raise DriverError(
                    f"GPU device {host_path} does not exist on host {self.host.name}. An operator should "
                    "rediscover the host's GPUs (or drain the host) before it takes more instances.",
                    permanent=True,
                ) from None
        return [str(gid) for gid in sorted(gids - {0})]

    def _create_container(self, client, instance, gpus, network, volume):
        gpu_count = max(1, len(gpus))
        memory_bytes = int(self.host.memory_mb_per_gpu) * gpu_count * 1024 * 1024
        device_paths = self._device_paths(gpus)
        group_add = self._device_groups(device_paths, gpus)
        # A container cannot be given more CPUs than the engine has; a host configured with a generous
        # cpus_per_gpu still runs its 8x instances, on every CPU it has.
        engine_cpus = engine_cpu_count(client)
        nano_cpus = int(min(self.host.cpus_per_gpu * gpu_count, engine_cpus) * 1e9)
        publish_ip = self.publish_address()
        try:
            return client.containers.create(
                instance.image.reference,
                name=container_name(instance),
                hostname=f"devcloud-{instance.short_id}",
                labels=instance_labels(instance, gpus),
                user=CONTAINER_USER,
                environment={
                    "JUPYTER_TOKEN": instance.jupyter_token,
                    "JUPYTER_BASE_URL": jupyter_base_url(instance),
                    # Only a convenience: inside the container its GPUs are 0..n-1. Isolation comes
                    # from the container having no other render nodes.
                    "HIP_VISIBLE_DEVICES": ",".join(str(i) for i in range(len(gpus))),
                    "DEVCLOUD_INSTANCE_ID": str(instance.id),
                    "DEVCLOUD_GPU_COUNT": str(len(gpus)),
                    "DEVCLOUD_SSH_PORT": str(SSH_PORT),
                },
                devices=[f"{host_path}:{container_path}:rwm" for host_path, container_path in device_paths],
                group_add=group_add,
                privileged=False,
                cap_drop=["ALL"],
                security_opt=["no-new-privileges:true"],
                mem_limit=memory_bytes,
                memswap_limit=memory_bytes,
                nano_cpus=nano_cpus,
                pids_limit=pids_per_gpu() * gpu_count,
                shm_size=min(memory_bytes // 2, MAX_SHM_BYTES),
                ipc_mode="private",
                network=network,
                ports={f"{JUPYTER_PORT}/tcp": (publish_ip, None), f"{SSH_PORT}/tcp": (publish_ip, None)},
                mounts=[Mount(target=WORKSPACE, source=volume, type="volume")],
                log_config={"type": "json-file", "config": {"max-size": "10m", "max-file": "2"}},
                restart_policy={"Name": "no"},
                detach=True,
            )
        except docker.errors.ImageNotFound as error:
            # Placement sends a launch to a host without its image only while a pull of it is under way
            # there (or the host's images were never looked at): wait for the image rather than fail.
            if on_a_registry(instance.image.reference):
                try:
                    self._pull(instance.image.reference, lambda line: None)
                except DriverError:
                    pass
                else:
                    return self._create_container(client, instance, gpus, network, volume)
            raise DriverError(
                f"The image {instance.image.reference} ({instance.image.name}) is not on host "
                f"{self.host.name}. An operator can build or pre-pull it from the admin console "
                "(or run scripts/build-images.sh there).",
                permanent=True,
            ) from error
        except docker.errors.APIError as error:
            if error.status_code != 409:
                raise
        # A concurrent attempt created it first.
        return self._made_by_other_attempt(client.containers.get, container_name(instance))

    def _made_by_other_attempt(self, get, name: str):
        """Returns what a concurrent start of the same instance is making, once the engine shows it.

        The engine reserves a name before the thing can be looked up by it, so the loser of a race sees
        the conflict a moment before it can find the winner's. Giving up (or treating the conflict as a
        failure) would make the loser discard the winner's container and network and fail the launch.
        Raises DriverError(permanent=False) if it does not appear within RACE_WAIT_SECONDS.
        """
        deadline = time.monotonic() + RACE_WAIT_SECONDS
        while True:
            try:
                return get(name)
            except docker.errors.NotFound:
                if time.monotonic() > deadline:
                    raise DriverError(
                        f"{name} is being made by another attempt on host {self.host.name}.", permanent=False
                    ) from None
                time.sleep(0.05)

    @staticmethod
    def _published_port(container, port: int) -> int | None:
        """The host port the engine published the container's `port` on, or None when it is not published."""
        bindings = (container.attrs.get("NetworkSettings", {}).get("Ports") or {}).get(f"{port}/tcp") or []
        return int(bindings[0]["HostPort"]) if bindings else None

    def authorized_keys_set(self, instance, text: str) -> bool:
        """Makes `text` the instance's ~/.ssh/authorized_keys (uid 1000, mode 0600), the keys its sshd trusts.

        Returns False when the instance has no container (never started, or removed) or its image has no
        ~/.ssh (made before SSH). Raises DriverError(permanent=False) when the engine cannot be reached.
        """
        try:
            container = self._find_container(self.client(), container_name(instance))
            return container is not None and self._put_authorized_keys(container, text)
        except docker.errors.NotFound:
            return False
        except Exception as error:
            raise self._api_error(error, "updating the SSH keys") from error

    @staticmethod
    def _put_authorized_keys(container, text: str) -> bool:
        """Writes the file; False when the image has no ~/.ssh (an image from before SSH: no sshd either)."""
        from portal.sshgateway.services import authorized_keys_archive

        # The engine writes the file into the container's filesystem itself (running or not), as the tar
        # says: owner 1000, mode 0600. Nothing runs inside, so a tenant's process cannot interfere.
        try:
            return bool(container.put_archive(SSH_DIR, authorized_keys_archive(text)))
        except docker.errors.NotFound:
            return False

    def _endpoint(self, container) -> tuple[str, int]:
        bindings = (container.attrs.get("NetworkSettings", {}).get("Ports") or {}).get(
            f"{JUPYTER_PORT}/tcp"
        ) or []
        if not bindings:
            state = container.attrs.get("State", {})
            raise DriverError(
                f"Container {container.name} is {container.status} with no published port"
                + (f": {state['Error']}" if state.get("Error") else "")
                + f" (exit code {state.get('ExitCode')}).",
                permanent=False,
            )
        port = int(bindings[0]["HostPort"])
        address = self.publish_address()
        host_part = f"[{address}]" if ":" in address else address
        return f"http://{host_part}:{port}", port

    def _discard(self, client, instance):
        """Best-effort removal of a half-made instance after a permanent failure, so a retry starts clean."""
        try:
            container = self._find_container(client, container_name(instance))
            if container is not None:
                container.remove(force=True)
            self._remove_networks(client, instance)
        except Exception:  # the failure being reported matters more than this cleanup's
            logger.warning("could not clean up after a failed start of %s", instance.id, exc_info=True)


class PullProgress:
    """How far a pull has got, from the engine's per-layer messages. Each layer counts the same: its
    download is its first half and its extraction the second (each by bytes, as the engine reports
    them). The engine lists every layer before the first download, so the mean only grows; it is kept
    from going back all the same. update() returns the new whole percent when it moved, else None."""

    def __init__(self):
        self.layers: dict[str, float] = {}  # layer id -> fraction done, 0..1
        self.percent = 0

    def update(self, chunk: dict) -> int | None:
        layer, status = chunk.get("id"), chunk.get("status") or ""
        if not layer or status.startswith("Pulling from"):  # the tag's own line, not a layer
            return None
        detail = chunk.get("progressDetail") or {}
        share = detail.get("current", 0) / detail["total"] if detail.get("total") else 0.0
        done = self.layers.get(layer, 0.0)
        if status == "Downloading":
            done = max(done, 0.5 * min(share, 1.0))
        elif status in ("Verifying Checksum", "Download complete"):
            done = max(done, 0.5)
        elif status == "Extracting":
            done = max(done, 0.5 + 0.5 * min(share, 1.0))
        elif status in ("Pull complete", "Already exists"):
            done = 1.0
        self.layers[layer] = done
        percent = min(int(100 * sum(self.layers.values()) / len(self.layers)), 99)  # 100 once it is done
        if percent <= self.percent:
            return None
        self.percent = percent
        return percent


def on_a_registry(reference: str) -> bool:
    """True when the reference names a registry host ("registry.example:5000/devcloud/cpu:abc"), so a
    host can pull it; a bare "devcloud/cpu:abc" exists only where it was built or loaded."""
    first, slash, _ = reference.partition("/")
    return bool(slash) and ("." in first or ":" in first or first == "localhost")


def _reason(error) -> str:
    text = str(getattr(error, "explanation", None) or error)
    return text if len(text) < 300 else text[:300] + "..."
