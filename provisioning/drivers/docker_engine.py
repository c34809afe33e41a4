"""A host's Docker engine: the connection, and the engine's own housekeeping.

Housekeeping is what is not an instance: images (present, built, pulled), workspace volumes and the
engine's facts (its CPU count). provisioning/images.py, provisioning/workspaces.py and
provisioning/hostfs.py work through it, and so does the instance driver (provisioning/drivers/docker.py)
for its connection. It reads nothing but the host row it is built with.
"""

import io
import logging
import shutil
import tempfile
import threading
import time
import uuid
import weakref

import docker
import docker.errors
import docker.tls
import requests.exceptions
from django.conf import settings

from portal.instances.catalog import CatalogError, load_catalog

from ..engine import EngineSettingsError, build_client, has_tls, host_tls
from .base import DriverError

logger = logging.getLogger(__name__)

# Builds and pulls stream for minutes with silent steps; ordinary API calls get the shorter timeout.
BUILD_TIMEOUT = 3600
# How long a worker trusts the CPU count it read from an engine. `info` is one of the engine's slower
# calls, and every start needs the count (a container cannot be given more CPUs than its engine has); it
# changes only when the machine does, so a burst of starts reads it once.
ENGINE_CPUS_SECONDS = 60.0
_engine_cpus: dict[str, tuple[float, int]] = {}
_engine_cpus_lock = threading.Lock()


def api_timeout() -> int:
    # Seconds for one Docker API call. A hung engine must fail the task (transiently), not hang it.
    return getattr(settings, "DEVCLOUD_DOCKER_TIMEOUT", 30)


def portal_id() -> str:
    """This install's id (provisioning/identity.py): the devcloud.portal label on everything it makes."""
    from ..identity import install_id

    return install_id()


def volume_name(owner_key: str) -> str:
    # The install id and the person's never-reused key (accounts.User.workspace_key): a new account that
    # gets an old numeric id, or the same id on another install sharing the engine, never gets these files.
    return f"{portal_id()}-ws-{owner_key}"


def volume_labels(user_id, owner_key: str) -> dict[str, str]:
    # devcloud.owner is what the mount check (volume_refusal) compares; devcloud.user is kept for people.
    return {
        "devcloud.managed": "true",
        "devcloud.portal": portal_id(),
        "devcloud.owner": owner_key,
        "devcloud.user": str(user_id),
    }


def volume_refusal(labels, *, install: str, owner_id, owner_key: str) -> str:
    """Why a volume must not be mounted as this person's workspace, in words; "" when it is theirs.

    A volume made before owner keys (no devcloud.owner label) is theirs when this install made it for
    their numeric id: only a Workspace row names such a volume (provisioning/workspaces.workspace_name).
    """
    labels = labels or {}
    portal = labels.get("devcloud.portal", "")
    if portal != install:
        return f"it was made by another DevCloud install ({portal or 'no install label'}, this is {install})"
    owner = labels.get("devcloud.owner", "")
    if owner and owner != owner_key:
        return f"it belongs to another person (owner key {owner})"
    if not owner and labels.get("devcloud.user", "") != str(owner_id):
        return f"it belongs to another person (user {labels.get('devcloud.user') or 'unknown'})"
    return ""


# --- Disk limits (docs/architecture.md, "Disk limits") ---------------------------------------------


def limits_policy() -> str:
    """settings.DEVCLOUD_DISK_LIMITS: "enforce" (refuse what the engine cannot limit) or "warn"."""
    return getattr(settings, "DEVCLOUD_DISK_LIMITS", "enforce")


def cannot_limit(error) -> bool:
    """True when the engine refused a size limit because its storage cannot enforce one.

    The engine's words: a local volume's `size` needs project quotas under its data root ("quota size
    requested but no quota support"); `--storage-opt size` needs overlay2 on XFS with pquota (or btrfs).
    """
    if not isinstance(error, docker.errors.APIError):
        return False
    text = str(error.explanation or error).lower()
    return "quota" in text or "storage-opt" in text or "storage option" in text


def unlimited_disk(host_name: str, what: str, error) -> None:
    """Called when host `host_name`'s engine cannot enforce the limit on `what`. Under "enforce" raises
    DriverError(permanent=True) saying what the operator can do; under "warn" logs it for the operator and
    returns, so the caller goes on without the limit (and records that it did)."""
    reason = _reason(error)
    if limits_policy() != "warn":
        raise DriverError(
            f"Host {host_name}'s Docker engine cannot limit the size of {what} ({reason}), so an instance "
            "there could fill the host's disk. An operator should give that engine a data root on XFS "
            "mounted with pquota (docs/architecture.md, \"Disk limits\") or drain the host; "
            "DEVCLOUD_DISK_LIMITS=warn starts instances there without the limit.",
            permanent=True,
        ) from error
    logger.warning(
        "Host %s's engine cannot limit the size of %s (%s): started without the limit, so one instance "
        "can fill its disk (DEVCLOUD_DISK_LIMITS=warn)",
        host_name, what, reason,
    )  # fmt: skip


def volume_create(client, name: str, *, labels: dict, limit_bytes: int, host_name: str, unlimited=None):
    """Makes the workspace volume `name`, holding at most `limit_bytes` (0: no limit), and returns it.

    The local driver's `size` option sets a project quota on the volume's directory: writes past it fail
    with ENOSPC inside the container. When the engine cannot enforce it: raises DriverError(permanent=True)
    under the policy "enforce" (unlimited_disk); under "warn" makes it without the limit and calls
    `unlimited()`. Docker errors otherwise.
    """
    if limit_bytes:
        try:
            return client.volumes.create(
                name, driver="local", driver_opts={"size": str(limit_bytes)}, labels=labels
            )
        except docker.errors.APIError as error:
            if not cannot_limit(error):
                raise
            unlimited_disk(host_name, "a /workspace", error)
            if unlimited is not None:
                unlimited()
    return client.volumes.create(name, labels=labels)


# Drivers whose `--storage-opt size` the engine enforces by itself (btrfs through qgroups, zfs by dataset
# quota); overlay2 enforces it only on XFS with project quotas, which the volume trial below shows.
LAYER_LIMITING_DRIVERS = ("btrfs", "zfs")


def disk_limit_support(client) -> dict:
    """What the engine can limit, asked up front rather than at a first launch. Returns a dict with
    "workspace" (bool: a local volume takes a `size`), "writable_layer" (bool: `--storage-opt size`
    works), "storage" ("overlay2 on extfs") and "reason" (the engine's words when it refused a size).

    The workspace answer is a real trial: a tiny size-limited volume is made and removed at once. The
    writable layer's is read from /info: btrfs and zfs can; overlay2 can when its backing filesystem is
    XFS and the trial volume got a project quota (the same data root). Raises Docker errors other than
    the engine's refusal of the size.
    """
    info = client.info()
    driver = info.get("Driver") or "?"
    backing = dict(pair for pair in info.get("DriverStatus") or [] if len(pair) == 2).get("Backing Filesystem", "")
    name = f"devcloud-size-probe-{uuid.uuid4().hex[:12]}"
    reason = ""
    try:
        volume = client.volumes.create(
            name, driver="local", driver_opts={"size": str(16 * 1024**2)}, labels={"devcloud.probe": "true"}
        )
    except docker.errors.APIError as error:
        if not cannot_limit(error):
            raise
        # "create devcloud-size-probe-...: quota size requested but no quota support": the probe's name says nothing.
        workspace, reason = False, _reason(error).removeprefix(f"create {name}: ")
    else:
        workspace = True
        volume.remove(force=True)
    writable_layer = driver in LAYER_LIMITING_DRIVERS or (driver == "overlay2" and backing == "xfs" and workspace)
    if not writable_layer and not reason:
        reason = f"{driver} on {backing or 'an unknown filesystem'} takes no --storage-opt size"
    return {
        "workspace": workspace,
        "writable_layer": writable_layer,
        "storage": f"{driver} on {backing}" if backing else driver,
        "reason": reason,
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


class DockerEngine:
    """The Docker engine of `host`: its client, its images and its volumes."""

    def __init__(self, host):
        self.host = host
        self._clients = {}
        self._tls_dir = None

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
            try:
                tls = host_tls(host)
            except EngineSettingsError as error:
                raise DriverError(str(error), permanent=True) from error
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
            # The client reads its TLS files on every connection, and they go with this object: a caller
            # that keeps only the client (DockerEngine(host).client()) must keep them too.
            self._clients[timeout].devcloud_engine = self
        return self._clients[timeout]

    def _unreachable(self, error) -> DriverError:
        return DriverError(
            f"The Docker engine of host {self.host.name} ({self.host.docker_url}) cannot be reached: "
            f"{_reason(error)}. "
            "This is usually temporary; if it lasts, check that dockerd runs on that host.",
            permanent=False,
        )

    def api_error(self, error, doing: str) -> DriverError:
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

    # --- Images (operator actions) ----------------------------------------------------------------

    def images(self) -> list[str]:
        """Every image tag present on the host, sorted.

        Raises DriverError(permanent=False) when the engine cannot be reached.
        """
        try:
            images = self.client().images.list()
        except Exception as error:
            raise self.api_error(error, "listing images") from error
        return sorted(tag for image in images for tag in image.tags)

    def has_image(self, reference: str) -> bool:
        try:
            self.client().images.get(reference)
            return True
        except docker.errors.ImageNotFound:
            return False
        except Exception as error:
            raise self.api_error(error, "looking for an image") from error

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
                self.pull(reference, report)
                return "pulled"
            except DriverError as error:
                report(f"{error.message} Building it instead.")
        if build_context:
            self._build(reference, build_context, report, catalog_path)
            return "built"
        self.pull(reference, report)
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
            raise self.api_error(error, f"building {reference}") from error
        report(f"built {reference}")

    def pull(self, reference: str, report) -> None:
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
            raise self.api_error(error, f"pulling {reference}") from error
        report(f"pulled {reference}")

    # --- Volumes ----------------------------------------------------------------------------------

    def remove_volume(self, name: str) -> bool:
        """Removes the volume `name`. Returns False when another container still mounts it (a later retry
        removes it); missing is success. Raises DriverError(permanent=False) when the engine cannot be
        reached."""
        try:
            self.client().volumes.get(name).remove()
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as error:
            if error.status_code != 409:
                raise self.api_error(error, "removing a workspace") from error
            return False
        except Exception as error:
            raise self.api_error(error, "removing a workspace") from error
        return True


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
