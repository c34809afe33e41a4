"""A fleet of GPU hosts on this machine: one `dockerd` per host, each in its own network namespace.

Each host is what a remote MI300X host looks like to the portal:
  - its engine listens only on tcp://<private address>:2376 with mutual TLS (certificates from a test CA
    made here with `cryptography`); its unix socket is for this module's own bookkeeping only;
  - it lives in a network namespace joined to this machine by a veth pair on a /24 of 10.231.0.0/16 of
    its own: the host is .2 (its private address), this machine (the portal and worker) is .1 (the
    host's gateway);
  - it has its own data-root and exec-root, a copy of the 8x MI300X KFD tree under <host dir>/root/sys,
    and stand-in /dev/kfd and /dev/dri/renderD<minor> nodes under <host dir>/root/dev, owned by a
    non-root render group whose gid differs from host to host, mode 0660;
  - where the kernel has XFS quotas, its engine's data root is a filesystem of its own that enforces
    disk limits, as DevCloud asks of production hosts: a sparse image file, loop-mounted as XFS with
    pquota (overlay2's `--storage-opt size` and the local volume driver's `size` both work). Elsewhere
    it is a plain directory, and `add_host(filesystem="btrfs")` gives a host whose data root is btrfs
    with the engine's btrfs storage driver (container writable layers are limited through qgroups;
    size-limited volumes are not, and the engine refuses them);
  - its containers reach the network through the host's own address (masquerade, as dockerd does on a
    real host), and the host drops new connections from instance bridges (`dc-*`) to itself, the
    firewall rule containers/README.md asks operators of production hosts for.

A real registry (Debian's `docker-registry`) serves images with TLS from the test CA on the fleet's
network, at an address of this machine that every host reaches through its gateway. Every engine on the
machine trusts it through /etc/docker/certs.d/<address>/ca.crt, which dockerd reads on each pull; the
entry is removed when the fleet stops. Images get there by a push from this machine's engine; the
registry's storage is kept between sessions, so a push of an unchanged image sends nothing.

Several test sessions may share the machine: each fleet takes a free *slot* (a lock file held for the
life of the process), and its names, addresses and directories all carry the slot number. Stopping a
fleet stops every dockerd (TERM, so they stop their containers) and the registry, and removes the
namespaces, links, mounts, the certs.d entry and the directories. Whatever a crashed session left in a
slot is removed the same way when the next fleet takes that slot.

Use it from pytest through the `fleet` fixture (see tests/fleet/conftest.py), or from other code:

    with Fleet.start(hosts=2) as fleet:
        fleet.push(image_reference)
        image = fleet.pull(fleet.hosts[0], image_reference)

Fleet.start raises FleetUnavailable when this machine cannot run a fleet (not root, a tool missing).
"""

import concurrent.futures
import contextlib
import datetime
import ipaddress
import os
import shutil
import signal
import ssl
import subprocess
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import docker
import docker.errors
import docker.tls
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tests.support.machine import alive, netns_names, take_slot

# Directories of running fleets, one per slot; outside the repository, since names and addresses are
# global to the machine whichever checkout starts the fleet.
FLEET_ROOT = Path("/var/tmp/devcloud-fleet")
CERTS_D = Path("/etc/docker/certs.d")
KFD_TREE = Path(__file__).resolve().parent.parent / "fixtures" / "kfd" / "mi300x-8gpu"
SLOTS = 8
# Slot s uses 10.231.<32 s>.0/24 for its registry and 10.231.<32 s + n>.0/24 for host n.
HOSTS_PER_SLOT = 31
SUBNET = ipaddress.ip_network("10.231.0.0/16")
ENGINE_PORT = 2376
# Not 5000: a docker-registry system service (the Debian package enables one) may hold *:5000.
REGISTRY_PORT = 5231
# Host n's render group is gid 2300 + n: a different, non-root gid on every host, as on a real fleet.
RENDER_GID_BASE = 2300
TOOLS = {
    "mkfs.xfs": "xfsprogs",
    "ip": "iproute2",
    "nsenter": "util-linux",
    "iptables": "iptables",
    "dockerd": "docker.io",
    "docker-registry": "docker-registry",
}
START_TIMEOUT = 60
STOP_TIMEOUT = 30
# Seconds a host's engine gets per API call from the clients this module makes.
CLIENT_TIMEOUT = 60
# Apparent size of a host's data-root image: sparse, so it takes only what the engine writes.
DATA_ROOT_BYTES = 20 * 1024**3


class FleetUnavailable(Exception):
    """This machine cannot run a fleet; the message says why and what to install."""


class FleetError(Exception):
    """A fleet host or the registry did not start or stop as it should; the message has its log."""


# --- Certificates -----------------------------------------------------------------------------------


def pem(cert: x509.Certificate) -> str:
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def key_pem(key) -> str:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()


@dataclass
class CertificateAuthority:
    """A test CA that issues server and client certificates, valid for one day."""

    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    @classmethod
    def create(cls, name: str = "devcloud fleet test CA") -> "CertificateAuthority":
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.timezone.utc)
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
            )
            .sign(key, hashes.SHA256())
        )
        return cls(cert=cert, key=key)

    @property
    def cert_pem(self) -> str:
        return pem(self.cert)

    def issue(
        self, common_name: str, *, server_ip: str | None = None, client: bool = False
    ) -> tuple[str, str]:
        """Returns (certificate PEM, key PEM): a server certificate for `server_ip` (in subjectAltName),
        or a client certificate."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        )
        if server_ip:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(server_ip))]), critical=False
            ).add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        if client:
            builder = builder.add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
            )
        return pem(builder.sign(self.key, hashes.SHA256())), key_pem(key)


def _write(path: Path, text: str, mode: int = 0o644) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(text)
    os.chmod(path, mode)
    return path


# --- Processes and the network ------------------------------------------------------------------------


def _run(*command: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    if check and result.returncode != 0:
        raise FleetError(f"{' '.join(command)} failed ({result.returncode}): {result.stderr.strip()}")
    return result


def _in_netns(netns: str, *command: str, check: bool = True) -> subprocess.CompletedProcess:
    # nsenter --net, not `ip netns exec`: the latter remounts /sys, which hides the cgroup v1 hierarchies
    # from dockerd ("Devices cgroup isn't mounted"). Used for every command in a namespace alike.
    return _run("nsenter", f"--net=/var/run/netns/{netns}", *command, check=check)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _read_pid(pidfile: Path) -> int | None:
    try:
        return int(pidfile.read_text().strip())
    except (OSError, ValueError):
        return None


def _terminate(pid: int, *, grace: float) -> None:
    """TERM, then KILL after `grace` seconds. Returns once the process is gone (or was never there)."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        while alive(pid) and time.monotonic() < deadline + 10:
            time.sleep(0.05)


def _links() -> list[str]:
    output = _run("ip", "-o", "link", "show").stdout
    return [line.split(":", 2)[1].strip().split("@", 1)[0] for line in output.splitlines() if ":" in line]


def _unmount_under(directory: Path) -> None:
    """Lazily unmounts everything mounted at or below `directory` (deepest first)."""
    prefix = str(directory).rstrip("/") + "/"
    mounts = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point.startswith(prefix):
            mounts.append(point)
    for point in sorted(set(mounts), key=len, reverse=True):
        _run("umount", "-l", point, check=False)


def _kill_containers_of(data_root: Path) -> None:
    """Kills the processes of every container a dead dockerd left running (found by their cgroups)."""
    containers = data_root / "containers"
    if not containers.is_dir():
        return
    for container_id in os.listdir(containers):
        for procs in Path("/sys/fs/cgroup").glob(f"*/docker/{container_id}/cgroup.procs"):
            with contextlib.suppress(OSError):
                for pid in procs.read_text().split():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(pid), signal.SIGKILL)


# --- Hosts --------------------------------------------------------------------------------------------


@dataclass
class FleetHost:
    """One GPU host of the fleet. Its attributes are what an operator types when adding the host.

    docker_url, tls_ca_cert, tls_client_cert, tls_client_key  match the GpuHost fields (PEM text)
    private_address  the host's address on the fleet network, where published ports should bind
    gateway_address  this machine (the portal and worker) as the host sees it
    sysfs_root, dev_root  where the host's /sys/class/kfd and /dev/kfd, /dev/dri live, as seen on the
                     host; all hosts share this machine's filesystem, so these are paths here too
    render_gid       the gid that owns the host's /dev/kfd and render nodes (mode 0660)
    render_minors    the render minors of its 8 GPUs (128, 136, ...)
    """

    name: str
    index: int
    netns: str
    directory: Path
    private_address: str
    gateway_address: str
    render_gid: int
    render_minors: list[int]
    tls_ca_cert: str
    tls_client_cert: str
    tls_client_key: str
    _client_files: tuple[Path, Path, Path]
    # The data root's own filesystem: "xfs" (with pquota), "btrfs", or "" (a directory of this machine's).
    filesystem: str = ""
    _process: subprocess.Popen | None = field(default=None, repr=False)

    @property
    def docker_url(self) -> str:
        return f"tcp://{self.private_address}:{ENGINE_PORT}"

    @property
    def sysfs_root(self) -> str:
        return str(self.directory / "root")

    @property
    def dev_root(self) -> str:
        return str(self.directory / "root")

    @property
    def kfd_path(self) -> str:
        return os.path.join(self.dev_root, "dev", "kfd")

    def render_node_path(self, minor: int) -> str:
        return os.path.join(self.dev_root, "dev", "dri", f"renderD{minor}")

    @property
    def data_root(self) -> Path:
        return self.directory / "data"

    @property
    def data_image(self) -> Path:
        return self.directory / "data.img"

    @property
    def exec_root(self) -> Path:
        return self.directory / "exec"

    @property
    def pidfile(self) -> Path:
        return self.directory / "dockerd.pid"

    @property
    def log_path(self) -> Path:
        return self.directory / "dockerd.log"

    @property
    def unix_socket(self) -> Path:
        return self.directory / "docker.sock"

    @property
    def pid(self) -> int | None:
        """The pid of the host's running dockerd, or None when it is not running."""
        pid = _read_pid(self.pidfile)
        return pid if pid and alive(pid) else None

    def client(self, *, timeout: float = CLIENT_TIMEOUT) -> docker.DockerClient:
        """A docker.DockerClient for the host's engine over mutual TLS, as the portal's worker has."""
        ca, cert, key = self._client_files
        tls = docker.tls.TLSConfig(client_cert=(str(cert), str(key)), ca_cert=str(ca), verify=str(ca))
        client = docker.DockerClient(base_url=self.docker_url, tls=tls, timeout=timeout, version="1.41")
        # REQUESTS_CA_BUNDLE or proxies from the environment must not replace the fleet's CA.
        client.api.trust_env = False
        return client

    def gpuhost_fields(self) -> dict:
        """Keyword arguments for GpuHost.objects.create: the fields of the model that this host fills in
        (private_address and render_gid only where the model has them)."""
        from provisioning.models import GpuHost

        values = {
            "name": self.name,
            "docker_url": self.docker_url,
            "tls_ca_cert": self.tls_ca_cert,
            "tls_client_cert": self.tls_client_cert,
            "tls_client_key": self.tls_client_key,
            "sysfs_root": self.sysfs_root,
            "dev_root": self.dev_root,
            "private_address": self.private_address,
            "render_gid": self.render_gid,
        }
        model_fields = {f.name for f in GpuHost._meta.get_fields()}
        return {key: value for key, value in values.items() if key in model_fields}

    # -- dockerd --

    def _dockerd_command(self) -> list[str]:
        return [
            "nsenter",
            f"--net=/var/run/netns/{self.netns}",
            "dockerd",
            "--data-root", str(self.data_root),
            "--exec-root", str(self.exec_root),
            "--pidfile", str(self.pidfile),
            "-H", f"unix://{self.unix_socket}",
            "-H", f"tcp://{self.private_address}:{ENGINE_PORT}",
            "--tlsverify",
            "--tlscacert", str(self.directory / "tls" / "ca.pem"),
            "--tlscert", str(self.directory / "tls" / "server.pem"),
            "--tlskey", str(self.directory / "tls" / "server-key.pem"),
            # The root namespace's engine owns docker0 and the machine's iptables; NAT and the firewall of
            # this host are set up in its own namespace by _network_up.
            "--bridge", "none",
            "--iptables=false",
            "--ip-masq=false",
            *(["--storage-driver", "btrfs"] if self.filesystem == "btrfs" else []),
        ]  # fmt: skip

    def _launch_dockerd(self) -> None:
        self.pidfile.unlink(missing_ok=True)
        with open(self.log_path, "ab") as log:
            # A session of its own: a ^C to pytest reaches pytest, which then stops the engine in order.
            self._process = subprocess.Popen(
                self._dockerd_command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def wait_until_answering(self, timeout: float = START_TIMEOUT) -> None:
        """Returns once the engine answers a ping over TLS. Raises FleetError with its log otherwise."""
        deadline = time.monotonic() + timeout
        client = self.client(timeout=5)
        try:
            while True:
                try:
                    if client.ping():
                        return
                except Exception:  # noqa: BLE001 (not up yet: refused, reset, TLS not ready)
                    pass
                if self._process is not None and self._process.poll() is not None:
                    code = self._process.returncode
                    raise FleetError(f"dockerd of {self.name} exited ({code}):\n{self.log_tail()}")
                if time.monotonic() > deadline:
                    tail = self.log_tail()
                    raise FleetError(f"dockerd of {self.name} did not answer in {timeout}s:\n{tail}")
                time.sleep(0.1)
        finally:
            client.close()

    def log_tail(self, lines: int = 30) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def kill(self) -> None:
        """Kills the host's dockerd at once (SIGKILL), as a crash would: the engine stops answering. Its
        containers' processes keep running while it is down, as on a real host; when restart() brings
        the engine back, dockerd (without live-restore, the default) stops them (exit code 143)."""
        pid = self.pid
        if pid is None:
            return
        os.kill(pid, signal.SIGKILL)
        while alive(pid):
            time.sleep(0.02)
        if self._process is not None:
            self._process.wait()

    def restart(self, timeout: float = START_TIMEOUT) -> None:
        """Starts the host's dockerd again (after kill() or stop_engine()); returns once it answers."""
        if self.pid is not None:
            return
        # dockerd's own containerd died with it (parent-death signal), but where nothing reaps orphans
        # (a container's init) it stays a zombie, which dockerd takes for a running containerd and waits
        # for in vain. A pid file naming a dead process only misleads it.
        containerd_pidfile = self.exec_root / "containerd" / "containerd.pid"
        containerd_pid = _read_pid(containerd_pidfile)
        if containerd_pid and not alive(containerd_pid):
            containerd_pidfile.unlink(missing_ok=True)
        self._launch_dockerd()
        self.wait_until_answering(timeout)

    def stop_engine(self, grace: float = STOP_TIMEOUT) -> None:
        """Stops the host's dockerd as an operator would (TERM: it stops its containers first)."""
        pid = self.pid
        if pid is not None:
            _terminate(pid, grace=grace)
        if self._process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._process.wait(timeout=1)

    def disconnect(self) -> None:
        """Cuts the host off the network (its link goes down); its engine keeps running."""
        _run("ip", "link", "set", self.netns_link, "down")

    def reconnect(self) -> None:
        _run("ip", "link", "set", self.netns_link, "up")

    @property
    def netns_link(self) -> str:
        """The root namespace's end of the host's veth pair."""
        return self.netns.replace("dcfleet-s", "dcf").replace("-h", "h")


# --- The registry --------------------------------------------------------------------------------------


@dataclass
class Registry:
    """The fleet's image registry: Debian's docker-registry (distribution 2.8) with TLS from the test CA."""

    address: str  # "10.231.0.1:5231", as image references and certs.d name it
    directory: Path
    ca_pem: Path
    _process: subprocess.Popen | None = field(default=None, repr=False)

    def reference(self, reference: str) -> str:
        """The registry's name for a local reference, e.g. "10.231.0.1:5231/devcloud/cpu:abc" for
        "devcloud/cpu:abc"."""
        return f"{self.address}/{reference}"

    @property
    def url(self) -> str:
        return f"https://{self.address}"

    def get(self, path: str, *, timeout: float = 5) -> tuple[int, bytes]:
        """GET over TLS, verified against the fleet's CA. Returns (status, body)."""
        context = ssl.create_default_context(cafile=str(self.ca_pem))
        request = urllib.request.Request(self.url + path)
        try:
            with urllib.request.urlopen(request, context=context, timeout=timeout) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as error:
            return error.code, error.read()


# --- The fleet ----------------------------------------------------------------------------------------


class Fleet:
    """A running fleet: `hosts` (FleetHost), `registry` (Registry), `ca` (CertificateAuthority) and the
    client certificate every host accepts (client_cert_pem, client_key_pem). Start it with Fleet.start()."""

    def __init__(self, slot: int, lock_fd: int):
        self.slot = slot
        self._lock_fd = lock_fd
        self.directory = FLEET_ROOT / f"slot-{slot}"
        self.ca = CertificateAuthority.create()
        self.client_cert_pem, self.client_key_pem = self.ca.issue("devcloud-portal", client=True)
        self.hosts: list[FleetHost] = []
        self.registry: Registry | None = None
        self._pushed: set[str] = set()
        self._lock = threading.Lock()
        self.started_in_seconds = 0.0

    # -- names and addresses of this slot --

    def _subnet(self, n: int) -> str:
        """"10.231.<x>" for host n (n >= 1) or the registry (n == 0) of this slot."""
        return f"10.231.{self.slot * 32 + n}"

    @property
    def netns_prefix(self) -> str:
        return f"dcfleet-s{self.slot}-"

    @property
    def link_prefix(self) -> str:
        return f"dcf{self.slot}"

    @property
    def registry_address(self) -> str:
        return f"{self._subnet(0)}.1:{REGISTRY_PORT}"

    # -- life cycle --

    @classmethod
    def start(cls, hosts: int = 2, *, push: list[str] = (), slot: int | None = None) -> "Fleet":
        """Starts a registry and `hosts` GPU hosts in parallel; pushes the `push` references (present on
        this machine's engine) to the registry. Takes the first free slot, or `slot`. Returns the running
        Fleet, also a context manager that stops it.

        Raises FleetUnavailable when this machine cannot run a fleet, FleetError when something did not
        start (the fleet is stopped and cleaned first).
        """
        check_machine()
        if not 1 <= hosts <= HOSTS_PER_SLOT:
            raise ValueError(f"a fleet has 1 to {HOSTS_PER_SLOT} hosts")
        slot, lock_fd = take_slot(FLEET_ROOT, SLOTS, slot, what="fleet slots", unavailable=FleetUnavailable)
        fleet = cls(slot, lock_fd)
        began = time.monotonic()
        try:
            for trash in FLEET_ROOT.glob("trash-*"):
                _delete_in_background(trash)
            fleet._clean_leftovers()
            fleet._check_addresses_free()
            fleet.directory.mkdir(parents=True)
            _write(fleet.directory / "client" / "ca.pem", fleet.ca.cert_pem)
            _write(fleet.directory / "client" / "cert.pem", fleet.client_cert_pem)
            _write(fleet.directory / "client" / "key.pem", fleet.client_key_pem, 0o600)
            with concurrent.futures.ThreadPoolExecutor(max_workers=hosts + 1) as pool:
                registry = pool.submit(fleet._registry_start)
                started = [pool.submit(fleet._host_start, n) for n in range(1, hosts + 1)]
                fleet.registry = registry.result()
                fleet.hosts = [future.result() for future in started]
            for reference in push:
                fleet.push(reference)
        except BaseException:
            fleet.stop()
            raise
        fleet.started_in_seconds = time.monotonic() - began
        return fleet

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

    def add_host(self, *, filesystem: str | None = None) -> FleetHost:
        """Starts one more host (a "newly added" machine: empty engine, own GPUs); returns it. Its data
        root is `filesystem` ("xfs", "btrfs" or "" for a directory), by default what the others have."""
        with self._lock:
            n = max((host.index for host in self.hosts), default=0) + 1
            if n > HOSTS_PER_SLOT:
                raise ValueError(f"a fleet has at most {HOSTS_PER_SLOT} hosts")
            host = self._host_start(n, filesystem)
            self.hosts.append(host)
        return host

    def remove_host(self, host: FleetHost) -> None:
        """Stops `host` for good and removes its namespace, link and directory (a machine taken out)."""
        with self._lock:
            _host_stop(host.directory)
            if host._process is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    host._process.wait(timeout=5)
            for pid in _run("ip", "netns", "pids", host.netns, check=False).stdout.split():
                _terminate(int(pid), grace=2)
            _run("ip", "netns", "del", host.netns, check=False)
            _run("ip", "link", "del", host.netns_link, check=False)
            _unmount_under(host.directory)
            _remove_soon(host.directory)
            self.hosts.remove(host)

    def stop(self) -> None:
        """Stops every engine and the registry, and removes the namespaces, links, directories and the
        certs.d entry. Safe to call twice. Leaves the machine's network as it was."""
        self._clean_leftovers()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    # -- images --

    def push(self, reference: str) -> str:
        """Pushes `reference` from this machine's engine to the fleet's registry (once per fleet), leaving
        no new tag behind on this machine. Returns the registry's reference."""
        remote = self.registry.reference(reference)
        with self._lock:
            if reference in self._pushed:
                return remote
            local = docker.DockerClient(base_url="unix:///var/run/docker.sock", timeout=600, version="1.41")
            try:
                repository, tag = remote.rsplit(":", 1)
                local.images.get(reference).tag(repository, tag)
                try:
                    _stream_ok(local.api.push(repository, tag, stream=True, decode=True), f"push {remote}")
                finally:
                    local.images.remove(remote, noprune=True)
            finally:
                local.close()
            self._pushed.add(reference)
        return remote

    def pull_on_all(self, reference: str) -> None:
        """Pulls `reference` onto every host of the fleet, in parallel (see pull)."""
        self.push(reference)
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(self.hosts)) as pool:
            list(pool.map(lambda host: self.pull(host, reference), list(self.hosts)))

    def pull(self, host: FleetHost, reference: str) -> "docker.models.images.Image":
        """Pulls `reference` ("devcloud/cpu:abc") from the fleet's registry onto `host`, through the host's
        engine over TLS, and tags it there as `reference` too, so the host can start it by the name the
        portal knows. Pushes it first when needed. Returns the host's image."""
        remote = self.push(reference)
        repository, tag = remote.rsplit(":", 1)
        client = host.client(timeout=600)
        try:
            progress = client.api.pull(repository, tag, stream=True, decode=True)
            _stream_ok(progress, f"pull {remote} on {host.name}")
            image = client.images.get(remote)
            local_repository, local_tag = reference.rsplit(":", 1)
            image.tag(local_repository, local_tag)
            if host.filesystem == "btrfs":
                _btrfs_roots_open(host)
            return client.images.get(reference)
        finally:
            client.close()

    # -- internals --

    def _check_addresses_free(self) -> None:
        """Raises FleetUnavailable when something else on this machine uses this slot's addresses."""
        ours = ipaddress.ip_network(f"{self._subnet(0)}.0/19")
        for line in _run("ip", "-4", "-o", "addr", "show").stdout.splitlines():
            parts = line.split()
            interface, address = parts[1], parts[3]
            mine = interface.startswith(self.link_prefix)
            if ipaddress.ip_interface(address).network.overlaps(ours) and not mine:
                raise FleetUnavailable(f"{address} on {interface} overlaps the fleet's test subnet {ours}")
        for line in _run("ip", "-4", "route", "show").stdout.splitlines():
            destination = line.split()[0]
            if destination == "default":
                continue
            if ipaddress.ip_network(destination, strict=False).overlaps(ours):
                raise FleetUnavailable(f"the route `{line}` overlaps the fleet's test subnet {ours}")

    def _host_start(self, n: int, filesystem: str | None = None) -> FleetHost:
        from provisioning.inventory import read_inventory
        from provisioning.localhost import standin_devices_make

        netns = f"{self.netns_prefix}h{n}"
        directory = self.directory / f"h{n}"
        directory.mkdir(parents=True)
        # The host's KFD tree and /dev, where the host "lives"; the tree is copied so a test may change it.
        root = directory / "root"
        shutil.copytree(KFD_TREE / "sys", root / "sys")
        minors = [gpu.drm_render_minor for gpu in read_inventory(root)]
        render_gid = standin_devices_make(root, minors, gid=RENDER_GID_BASE + n)
        private_address = f"{self._subnet(n)}.2"
        server_cert, server_key = self.ca.issue(f"fleet-host-{n}", server_ip=private_address)
        _write(directory / "tls" / "ca.pem", self.ca.cert_pem)
        _write(directory / "tls" / "server.pem", server_cert)
        _write(directory / "tls" / "server-key.pem", server_key, 0o600)
        client_dir = self.directory / "client"
        host = FleetHost(
            name=f"fleet-{n}",
            index=n,
            netns=netns,
            directory=directory,
            private_address=private_address,
            gateway_address=f"{self._subnet(n)}.1",
            render_gid=render_gid,
            render_minors=minors,
            tls_ca_cert=self.ca.cert_pem,
            tls_client_cert=self.client_cert_pem,
            tls_client_key=self.client_key_pem,
            _client_files=(client_dir / "ca.pem", client_dir / "cert.pem", client_dir / "key.pem"),
        )
        host.filesystem = quota_filesystem() if filesystem is None else filesystem
        if host.filesystem:
            _data_root_mount(host.filesystem, host.data_image, host.data_root)
        self._network_up(host)
        host._launch_dockerd()
        host.wait_until_answering()
        return host

    def _network_up(self, host: FleetHost) -> None:
        link = host.netns_link
        inner = f"{link}n"
        _run("ip", "netns", "add", host.netns)
        _run("ip", "link", "add", link, "type", "veth", "peer", "name", inner)
        _run("ip", "link", "set", inner, "netns", host.netns)
        _run("ip", "-n", host.netns, "link", "set", inner, "name", "eth0")
        _run("ip", "addr", "add", f"{host.gateway_address}/24", "dev", link)
        _run("ip", "link", "set", link, "up")
        _run("ip", "-n", host.netns, "addr", "add", f"{host.private_address}/24", "dev", "eth0")
        _run("ip", "-n", host.netns, "link", "set", "lo", "up")
        _run("ip", "-n", host.netns, "link", "set", "eth0", "up")
        _run("ip", "-n", host.netns, "route", "add", "default", "via", host.gateway_address)
        # What dockerd's own ip-masq and ip-forward do on a real host, kept inside the host's namespace:
        # containers reach the network through the host's address.
        _in_netns(host.netns, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1")
        _in_netns(host.netns, "iptables", "-t", "nat", "-A", "POSTROUTING", "-o", "eth0", "-j", "MASQUERADE")
        # The production host firewall of containers/README.md: instance bridges (dc-*) open no new
        # connection to the host itself, so the engine port is out of a tenant's reach.
        _in_netns(
            host.netns,
            *("iptables", "-I", "INPUT", "-i", "dc-+", "-m", "conntrack", "--ctstate", "NEW", "-j", "DROP"),
        )

    def _registry_start(self) -> Registry:
        directory = self.directory / "registry"
        host_ip, port = self.registry_address.rsplit(":", 1)
        link = f"{self.link_prefix}reg"
        # A veth pair whose both ends stay here: an address on the fleet network that every host reaches
        # through its gateway (this machine), without forwarding between namespaces.
        _run("ip", "link", "add", link, "type", "veth", "peer", "name", f"{link}p")
        _run("ip", "addr", "add", f"{host_ip}/24", "dev", link)
        _run("ip", "link", "set", link, "up")
        _run("ip", "link", "set", f"{link}p", "up")
        cert, key = self.ca.issue("fleet-registry", server_ip=host_ip)
        _write(directory / "cert.pem", cert)
        _write(directory / "key.pem", key, 0o600)
        ca_pem = _write(directory / "ca.pem", self.ca.cert_pem)
        # Kept from session to session (per slot: one registry at a time uses it): it is content-addressed,
        # so pushing an unchanged image again sends nothing, where a fresh push of the CPU image takes from
        # 20 s to over a minute on a busy machine. `rm -rf /var/tmp/devcloud-fleet` reclaims it.
        storage = FLEET_ROOT / f"registry-cache-{self.slot}"
        storage.mkdir(exist_ok=True)
        config = f"""version: 0.1
log:
  level: warn
  accesslog:
    disabled: true
storage:
  cache:
    blobdescriptor: inmemory
  filesystem:
    rootdirectory: {storage}
  delete:
    enabled: true
http:
  addr: {self.registry_address}
  tls:
    certificate: {directory / "cert.pem"}
    key: {directory / "key.pem"}
"""
        _write(directory / "config.yml", config)
        # Every dockerd on this machine (the hosts' and the root namespace's, which pushes) trusts the
        # registry through this one global directory; nothing else is keyed by this address.
        _write(CERTS_D / self.registry_address / "ca.crt", self.ca.cert_pem)
        registry = Registry(address=self.registry_address, directory=directory, ca_pem=ca_pem)
        with open(directory / "registry.log", "ab") as log:
            registry._process = subprocess.Popen(
                ["docker-registry", "serve", str(directory / "config.yml")],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        _write(directory / "registry.pid", str(registry._process.pid))
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                status, _ = registry.get("/v2/", timeout=2)
                if status == 200:
                    return registry
            except OSError:
                pass
            if registry._process.poll() is not None or time.monotonic() > deadline:
                log_text = (directory / "registry.log").read_text(errors="replace")[-3000:]
                raise FleetError(f"docker-registry did not start on {self.registry_address}:\n{log_text}")
            time.sleep(0.05)

    def _clean_leftovers(self) -> None:
        """Stops and removes everything of this slot: a running fleet's or a crashed run's."""
        directory = self.directory
        hosts = sorted(directory.glob("h*")) if directory.is_dir() else []
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(hosts))) as pool:
            list(pool.map(_host_stop, hosts))
        registry_pid = _read_pid(directory / "registry" / "registry.pid")
        if registry_pid and "docker-registry" in _cmdline(registry_pid):
            _terminate(registry_pid, grace=5)
        if self.registry is not None and self.registry._process is not None:
            self.registry._process.wait()
        for host in self.hosts:
            if host._process is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    host._process.wait(timeout=5)
        for netns in netns_names():
            if netns.startswith(self.netns_prefix):
                for pid in _run("ip", "netns", "pids", netns, check=False).stdout.split():
                    _terminate(int(pid), grace=2)
                _run("ip", "netns", "del", netns, check=False)
        for link in _links():
            # dcf<slot>h<n> and dcf<slot>reg; dcf<slot>regp goes with its peer.
            if link.startswith(self.link_prefix) and link[len(self.link_prefix) :][:1] in ("h", "r"):
                _run("ip", "link", "del", link, check=False)
        shutil.rmtree(CERTS_D / self.registry_address, ignore_errors=True)
        with contextlib.suppress(OSError):
            CERTS_D.rmdir()  # only when empty: it did not exist before the first fleet here
        if directory.exists():
            _unmount_under(directory)
            _remove_soon(directory)


def _remove_soon(directory: Path) -> None:
    """Moves `directory` out of the way at once and deletes it in the background: a host's data root and
    the registry hold an unpacked image each, which takes half a minute to delete on a busy machine.
    Leftovers of an interrupted delete go with the next fleet's."""
    trash = FLEET_ROOT / f"trash-{os.getpid()}-{time.monotonic_ns()}"
    try:
        directory.rename(trash)
    except OSError:
        shutil.rmtree(directory, ignore_errors=True)
        return
    _delete_in_background(trash)


def _delete_in_background(path: Path) -> None:
    # A session of its own: it finishes even when the test process exits first.
    subprocess.Popen(
        ["rm", "-rf", "--one-file-system", str(path)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


_quota_filesystem: str | None = None
_quota_filesystem_lock = threading.Lock()


def quota_filesystem() -> str:
    """"xfs" when this kernel mounts XFS with project quotas (CONFIG_XFS_QUOTA), else ""; asked once per
    process with a small probe image."""
    global _quota_filesystem
    with _quota_filesystem_lock:  # hosts start in parallel threads
        if _quota_filesystem is None:
            probe = FLEET_ROOT / f"xfs-probe-{os.getpid()}"
            (probe / "mnt").mkdir(parents=True, exist_ok=True)
            try:
                _make_filesystem("xfs", probe / "img", 320 * 1024**2)
                mount = _run("mount", "-o", "loop,pquota", str(probe / "img"), str(probe / "mnt"), check=False)
                _quota_filesystem = "xfs" if mount.returncode == 0 else ""
                if mount.returncode == 0:
                    _run("umount", str(probe / "mnt"))
            finally:
                shutil.rmtree(probe, ignore_errors=True)
        return _quota_filesystem


def _make_filesystem(kind: str, image: Path, size: int) -> None:
    with open(image, "wb") as handle:
        handle.truncate(size)
    _run(f"mkfs.{kind}", "-q", "-f", str(image))


def _data_root_mount(kind: str, image: Path, data_root: Path) -> None:
    """Makes a `kind` filesystem ("xfs" or "btrfs") in the sparse file `image` and loop-mounts it at
    `data_root` (XFS with pquota). The loop device goes with the mount (autoclear), so stopping the fleet
    only unmounts it."""
    _make_filesystem(kind, image, DATA_ROOT_BYTES)
    data_root.mkdir(parents=True, exist_ok=True)
    _run("mount", "-o", "loop,pquota" if kind == "xfs" else "loop", str(image), str(data_root))
    if kind == "btrfs":
        # Removing a container with a big layer would otherwise switch qgroup accounting off, and with it
        # every limit, until a rescan (the kernel skips accounting for subtree drops from level 3 up).
        _run("btrfs", "quota", "enable", str(data_root))
        uuid = _run("btrfs", "filesystem", "show", str(data_root)).stdout.split("uuid:", 1)[1].split()[0]
        Path(f"/sys/fs/btrfs/{uuid}/qgroups/drop_subtree_threshold").write_text("8")


def _btrfs_roots_open(host: "FleetHost") -> None:
    """Docker 20.10's btrfs driver makes each layer's root directory mode 0700, so uid 1000 cannot even
    stat /usr/bin/tini in a container; 0755, as on overlay2. Snapshots (the containers' layers) copy it."""
    subvolumes = host.data_root / "btrfs" / "subvolumes"
    for layer in subvolumes.iterdir() if subvolumes.is_dir() else ():
        os.chmod(layer, 0o755)


def _host_stop(directory: Path) -> None:
    """Stops the dockerd of a host directory (TERM, so it stops its containers) and whatever it left."""
    pid = _read_pid(directory / "dockerd.pid")
    if pid and str(directory) in _cmdline(pid):
        _terminate(pid, grace=STOP_TIMEOUT)
    # A dockerd that was killed leaves its containers running; their processes are in its cgroups.
    _kill_containers_of(directory / "data")


def _stream_ok(lines, what: str) -> None:
    for line in lines:
        if "error" in line or "errorDetail" in line:
            raise FleetError(f"{what}: {line.get('error') or line.get('errorDetail')}")


def check_machine() -> None:
    """Raises FleetUnavailable when this machine cannot run a fleet (not root, or a tool missing)."""
    if os.geteuid() != 0:
        raise FleetUnavailable("a fleet needs root (network namespaces, dockerd, mknod)")
    missing = [f"{tool} (Debian package {package})" for tool, package in TOOLS.items()
               if shutil.which(tool) is None]
    if missing:
        raise FleetUnavailable(
            f"missing {', '.join(missing)}: scripts/test-services.sh installs them"
        )
    if not KFD_TREE.is_dir():
        raise FleetUnavailable(f"the KFD fixture tree {KFD_TREE} is missing")


# --- Containers on a host -------------------------------------------------------------------------------


def run_python(
    host: FleetHost, image: str, code: str, *args: str, timeout: float = 60, **create
) -> tuple[int, str]:
    """Runs `python3 -c code args...` in a new container from `image` on `host` (under the image's tini,
    so it stops on TERM), waits for it and removes it. `create` goes to containers.create (user,
    devices, group_add, network, ...; network_mode "none" unless a network is given).
    Returns (exit code, output)."""
    if "network" not in create:
        create.setdefault("network_mode", "none")
    client = host.client()
    try:
        container = client.containers.create(
            image, entrypoint=["/usr/bin/tini", "--", "python3", "-c", code, *args], detach=True, **create
        )
        try:
            container.start()
            code = container.wait(timeout=timeout)["StatusCode"]
            return code, container.logs().decode(errors="replace")
        finally:
            container.remove(force=True)
    finally:
        client.close()


# --- pytest fixtures --------------------------------------------------------------------------------------
# One fleet per test process, however many conftest or test modules import these fixtures: pytest makes
# a session fixture per module that defines it, so the fleet itself lives here.

FLEET_HOSTS = 2
_fleet: Fleet | None = None
_unavailable: str | None = None


def fleet_get() -> Fleet:
    """The process's fleet, started on first use. Skips the test when this machine cannot run one."""
    global _fleet, _unavailable
    import pytest

    if _unavailable:
        pytest.skip(_unavailable)
    if _fleet is None:
        try:
            _fleet = Fleet.start(hosts=FLEET_HOSTS)
        except FleetUnavailable as error:
            _unavailable = f"no test fleet on this machine: {error}"
            pytest.skip(_unavailable)
    return _fleet


def fleet_stop() -> None:
    global _fleet
    if _fleet is not None:
        _fleet.stop()
        _fleet = None


def session_fixture(function):
    """`function` as a session-scoped pytest fixture named without its "_fixture" suffix."""
    import pytest

    return pytest.fixture(scope="session", name=function.__name__.removesuffix("_fixture"))(function)


@session_fixture
def fleet_fixture():
    """The running Fleet: fleet.hosts (two FleetHost, engines empty), fleet.registry, fleet.ca."""
    yield fleet_get()
    fleet_stop()


@session_fixture
def fleet_cpu_image_fixture(fleet):
    """The CPU JupyterLab image's reference ("devcloud/cpu:<hash>"), built if needed and pushed to the
    fleet's registry (once). Hosts do not have it until fleet.pull(host, reference)."""
    from tests.support.images import build_cpu_image

    reference = build_cpu_image()
    fleet.push(reference)
    return reference
