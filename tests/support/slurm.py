"""A Slurm GPU cluster on this machine: munge, slurmctld, slurmrestd and one slurmd per node.

Each node is what a compute node of a real Slurm cluster looks like to the portal:
  - its slurmd runs in a network namespace of its own, joined to this machine by a point-to-point veth:
    the node has 10.232.<slot>.1<n>/24, this machine (the controller, slurmrestd and the portal) is
    10.232.<slot>.1 on every link. A job's ports are reachable from here at the node's address;
  - it has eight stand-in GPUs as GRES: /dev/dri/renderD128..135 (c 226 128..135) and /dev/kfd (c 234 0)
    under <slot dir>/dev/<node>/, group render, mode 0660. With no driver behind them, opening one tells
    the devices cgroup's decision: ENXIO = allowed, EPERM = blocked (ConstrainDevices);
  - batch jobs can run an OCI bundle with `srun --container` (runc, see oci.conf below).

The controller has JWT as its alternative authentication; slurmrestd listens on 127.0.0.1:<free port> as
user nobody and takes `X-SLURM-USER-NAME` / `X-SLURM-USER-TOKEN` (cluster.token()). Accounting is off, so
a finished job stays visible for MinJobAge (300 s) only.

Several test sessions may share the machine: each cluster takes a free *slot* (a lock file held for the
life of the process), and its names, addresses, ports and directories carry the slot number (node names
too: the cgroup v1 hierarchies are named slurm_<node> and are global to the machine). Whatever a crashed
session left in a slot is removed when the next cluster takes that slot.

Use it from pytest through the `slurm_cluster` fixture (see tests/slurm/conftest.py), or from other code:

    with SlurmCluster.start(nodes=2) as cluster:
        token = cluster.token()
        rootfs = cluster.rootfs_for("devcloud/cpu:abc")

SlurmCluster.start raises SlurmUnavailable when this machine cannot run a cluster (not root, a tool
missing), SlurmError when a daemon did not start.
"""

import contextlib
import fcntl
import grp
import ipaddress
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.fleet import session_fixture
from tests.support.machine import alive, netns_names, take_slot

# Directories of running clusters, one per slot; outside the repository, since names, addresses and
# cgroups are global to the machine whichever checkout starts the cluster.
SLURM_ROOT = Path("/var/tmp/devcloud-slurm")
# Exported image root filesystems, kept between sessions (an export takes 10-20 s).
ROOTFS_CACHE = Path("/var/cache/devcloud-test/rootfs")
SLOTS = 8
MAX_NODES = 9
SUBNET = ipaddress.ip_network("10.232.0.0/16")
PARTITION = "gpu"
GRES_NAME = "gpu"
# slurmctld binds every address, so its port differs per slot; each slurmd has a namespace of its own.
SLURMCTLD_PORT_BASE = 16817
SLURMD_PORT = 16818
RENDER_MAJOR, FIRST_RENDER_MINOR = 226, 128
KFD_MAJOR, KFD_MINOR = 234, 0
TOOLS = {
    "ip": "iproute2",
    "nsenter": "util-linux",
    "munged": "munge",
    "slurmctld": "slurmctld",
    "slurmd": "slurmd",
    "slurmrestd": "slurmrestd",
    "scontrol": "slurm-client",
    "scancel": "slurm-client",
    "runc": "runc",
}
START_TIMEOUT = 30
# sinfo and scontrol hang for about 10 s per call when slurmctld is dead.
CLIENT_TIMEOUT = 15
REST_USER = "nobody"


# RunTimeRun: the deploy kit's wrapper, which puts back the bundle's root.path that Slurm 22.05 rewrites
# (the file says how). The test cluster runs that very file, so what operators install is what is tested.
OCI_RUN = Path(__file__).resolve().parents[2] / "deploy" / "slurm" / "oci-run"


class SlurmUnavailable(Exception):
    """This machine cannot run a Slurm cluster; the message says why and what to install."""


class SlurmError(Exception):
    """A daemon of the test cluster did not start or stop as it should; the message has its log."""


# --- Processes ------------------------------------------------------------------------------------------


def _run(*command: str, check: bool = True, timeout: float = 60, env=None) -> subprocess.CompletedProcess:
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env, check=False)
    except subprocess.TimeoutExpired as error:
        raise SlurmError(f"{' '.join(command)} did not answer in {timeout}s") from error
    if check and result.returncode != 0:
        raise SlurmError(f"{' '.join(command)} failed ({result.returncode}): {result.stderr.strip()}")
    return result


def _write(path: Path, text: str | bytes, mode: int = 0o644) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(descriptor, "wb" if isinstance(text, bytes) else "w") as handle:
        handle.write(text)
    os.chmod(path, mode)
    return path


def _wait_gone(pids, deadline: float) -> None:
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.02)


def _terminate(pids, *, grace: float) -> None:
    """TERM, then KILL after `grace` seconds. Returns once every process is gone (or was never there)."""
    pids = [pid for pid in pids if pid]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    _wait_gone(pids, time.monotonic() + grace)
    for pid in pids:
        if alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    _wait_gone(pids, time.monotonic() + 10)


def _pids_mentioning(text: str) -> list[int]:
    """Processes whose command line contains `text` (daemons name their slot's config or key file)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError):
            if text in Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                found.append(int(entry))
    return [pid for pid in found if pid != os.getpid()]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _remove_cgroups(name: str) -> None:
    """Removes a cgroup v1 subtree (e.g. "slurm_s0n1") from every hierarchy, deepest first, after
    killing whatever still runs in it. rmdir is the only way to remove a cgroup; files cannot be deleted."""
    for hierarchy in sorted(os.listdir("/sys/fs/cgroup")):
        top = Path("/sys/fs/cgroup") / hierarchy / name
        if not top.is_dir():
            continue
        groups = sorted((path for path, _, _ in os.walk(top)), key=len, reverse=True)
        for group in groups:
            with contextlib.suppress(OSError):
                for pid in Path(group, "cgroup.procs").read_text().split():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(pid), signal.SIGKILL)
        deadline = time.monotonic() + 5
        for group in groups:
            while True:
                try:
                    os.rmdir(group)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    # EBUSY while the killed processes are still exiting.
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.02)


# --- Nodes ----------------------------------------------------------------------------------------------


@dataclass
class SlurmNode:
    """One compute node: its Slurm name, its address (where its jobs' ports answer) and namespace."""

    name: str
    address: str
    netns: str
    link: str
    _process: subprocess.Popen | None = field(default=None, repr=False, compare=False)


# --- The cluster ----------------------------------------------------------------------------------------


class SlurmCluster:
    """A running Slurm cluster. Start it with SlurmCluster.start(); it is also a context manager that
    stops it.

    rest_url   slurmrestd's base URL ("http://127.0.0.1:<port>")
    conf_path  the slurm.conf path, for SLURM_CONF of the Slurm commands
    nodes      the SlurmNode list (name, address)
    partition  the partition every node is in ("gpu")
    gres_name  the GRES name of the GPUs ("gpu")
    controller_address  this machine as the nodes see it, where a job's callbacks can be received
    """

    partition = PARTITION
    gres_name = GRES_NAME

    def __init__(self, slot: int, lock_fd: int, *, gpus_per_node: int):
        self.slot = slot
        self._lock_fd = lock_fd
        self.directory = SLURM_ROOT / f"slot-{slot}"
        self.gpus_per_node = gpus_per_node
        self.nodes: list[SlurmNode] = []
        self.rest_port = 0
        self.started_in_seconds = 0.0
        self._munged: subprocess.Popen | None = None
        self._slurmctld: subprocess.Popen | None = None
        self._slurmrestd: subprocess.Popen | None = None

    # -- names, addresses and paths of this slot --

    @property
    def controller_address(self) -> str:
        return f"10.232.{self.slot}.1"

    @property
    def netns_prefix(self) -> str:
        return f"dcslurm{self.slot}-"

    @property
    def link_prefix(self) -> str:
        return f"dcslurm{self.slot}n"

    @property
    def node_prefix(self) -> str:
        return f"s{self.slot}n"

    @property
    def slurmctld_port(self) -> int:
        return SLURMCTLD_PORT_BASE + 2 * self.slot

    @property
    def conf_path(self) -> Path:
        return self.directory / "etc" / "slurm.conf"

    @property
    def rest_url(self) -> str:
        return f"http://127.0.0.1:{self.rest_port}"

    @property
    def oci_state_dir(self) -> Path:
        """runc's state directory (--root): a container of a running job has a directory here."""
        return self.directory / "oci" / "state"

    @property
    def munge_socket(self) -> Path:
        return self.directory / "mrun" / "munge.socket.2"

    @property
    def log_dir(self) -> Path:
        return self.directory / "log"

    def device_dir(self, node: str | SlurmNode) -> Path:
        """Where `node`'s stand-in /dev lives: <dir>/kfd and <dir>/dri/renderD128..."""
        name = node.name if isinstance(node, SlurmNode) else node
        return self.directory / "dev" / name

    def render_node_paths(self, node: str | SlurmNode) -> list[Path]:
        """The node's render nodes, in GRES index order (GPU i is renderD<128 + i>)."""
        dri = self.device_dir(node) / "dri"
        return [dri / f"renderD{FIRST_RENDER_MINOR + i}" for i in range(self.gpus_per_node)]

    def node(self, name: str) -> SlurmNode:
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(name)

    @property
    def environment(self) -> dict[str, str]:
        """os.environ plus SLURM_CONF: the environment for the Slurm commands of this cluster."""
        return {**os.environ, "SLURM_CONF": str(self.conf_path)}

    # -- life cycle --

    @classmethod
    def start(cls, nodes: int = 2, gpus_per_node: int = 8, *, slot: int | None = None) -> "SlurmCluster":
        """Starts munge, slurmctld, `nodes` slurmds (each in its own network namespace) and slurmrestd;
        returns once every node is idle and REST answers. Takes the first free slot, or `slot`. Returns the
        running SlurmCluster, also a context manager that stops it.

        Raises SlurmUnavailable when this machine cannot run a cluster, SlurmError when something did not
        start (the cluster is stopped and cleaned first).
        """
        check_machine()
        if not 1 <= nodes <= MAX_NODES:
            raise ValueError(f"a test cluster has 1 to {MAX_NODES} nodes")
        if not 1 <= gpus_per_node <= 64:
            raise ValueError("a node has 1 to 64 stand-in GPUs")
        slot, lock_fd = take_slot(SLURM_ROOT, SLOTS, slot, what="cluster slots", unavailable=SlurmUnavailable)
        cluster = cls(slot, lock_fd, gpus_per_node=gpus_per_node)
        began = time.monotonic()
        try:
            cluster._clean_leftovers()
            cluster._check_addresses_free()
            cluster.nodes = [
                SlurmNode(
                    name=f"{cluster.node_prefix}{n}",
                    address=f"10.232.{slot}.{10 + n}",
                    netns=f"{cluster.netns_prefix}n{n}",
                    link=f"{cluster.link_prefix}{n}",
                )
                for n in range(1, nodes + 1)
            ]
            cluster._write_files()
            cluster._munged_start()
            for node in cluster.nodes:
                cluster._network_up(node)
            cluster._slurmctld_start()
            for node in cluster.nodes:
                cluster._slurmd_launch(node)
            cluster._slurmrestd_start()
            cluster.wait_until_idle([node.name for node in cluster.nodes])
        except BaseException:
            cluster.stop()
            raise
        cluster.started_in_seconds = time.monotonic() - began
        return cluster

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

    def stop(self) -> None:
        """Cancels every job, stops the slurmds, slurmctld, slurmrestd and munge, and removes the job
        cgroups, the namespaces and the slot's directory. Safe to call twice."""
        self._clean_leftovers()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    # -- commands --

    def scontrol(self, *args: str, timeout: float = CLIENT_TIMEOUT, check: bool = True) -> str:
        """Runs `scontrol args...` against this cluster; returns its output. Raises SlurmError when it
        fails (check) or does not answer in `timeout` seconds (slurmctld down)."""
        return _run("scontrol", *args, timeout=timeout, check=check, env=self.environment).stdout

    def squeue(self, *args: str, timeout: float = CLIENT_TIMEOUT) -> list[dict]:
        """The cluster's jobs, as squeue sees them: [{"id", "name", "state", "reason", "nodes"}]."""
        output = _run(
            "squeue", "--noheader", "--all", "--format=%i|%j|%T|%r|%N", *args, timeout=timeout,
            env=self.environment,
        ).stdout
        jobs = []
        for line in output.splitlines():
            job_id, name, state, reason, nodes = line.split("|", 4)
            jobs.append({"id": int(job_id), "name": name, "state": state, "reason": reason, "nodes": nodes})
        return jobs

    def token(self, username: str = "root", lifespan: int = 3600) -> str:
        """A JWT for `username`, valid `lifespan` seconds (`scontrol token`), for X-SLURM-USER-TOKEN."""
        output = self.scontrol("token", f"username={username}", f"lifespan={lifespan}")
        match = re.search(r"SLURM_JWT=(\S+)", output)
        if not match:
            raise SlurmError(f"scontrol token printed no token: {output!r}")
        return match.group(1)

    def node_states(self) -> dict[str, str]:
        """{node name: state} as `scontrol show node` says it, e.g. "IDLE", "MIXED", "DOWN+NOT_RESPONDING"."""
        states = {}
        for line in self.scontrol("show", "node", "--oneliner").splitlines():
            name = re.search(r"NodeName=(\S+)", line)
            state = re.search(r"State=(\S+)", line)
            if name and state:
                states[name.group(1)] = state.group(1)
        return states

    def wait_until_idle(self, names: list[str], timeout: float = START_TIMEOUT) -> None:
        """Returns once every named node is IDLE and REST answers. Raises SlurmError otherwise."""
        deadline = time.monotonic() + timeout
        states: dict[str, str] = {}
        while True:
            with contextlib.suppress(SlurmError):
                states = self.node_states()
                if all(states.get(name) == "IDLE" for name in names) and self.rest_answers():
                    return
            if time.monotonic() > deadline:
                logs = "\n".join(self.log_tail(path.name) for path in sorted(self.log_dir.glob("*.log")))
                raise SlurmError(f"nodes not idle in {timeout}s ({states}), or REST silent:\n{logs}")
            time.sleep(0.05)

    def rest_answers(self) -> bool:
        """Whether slurmrestd answers (any HTTP status) on rest_url."""
        try:
            with urllib.request.urlopen(f"{self.rest_url}/openapi/v3", timeout=2) as response:
                return response.status == 200
        except urllib.error.HTTPError:
            return True
        except OSError:
            return False

    def log_tail(self, name: str, lines: int = 30) -> str:
        """The last lines of a daemon's log: "slurmctld.log", "slurmd-<node>.log", "slurmrestd.log"..."""
        with contextlib.suppress(OSError):
            text = (self.log_dir / name).read_text(errors="replace").splitlines()[-lines:]
            return f"--- {name}\n" + "\n".join(text)
        return ""

    # -- failures an operator sees --

    def kill_node(self, name: str) -> None:
        """Kills the node's slurmd at once (SIGKILL), as a crash would. Its jobs' processes keep running
        until slurmctld declares the node dead (DOWN after about 25 s) or the slurmd comes back."""
        node = self.node(name)
        for pid in self._slurmd_pids(node):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if node._process is not None:
            node._process.wait()
            node._process = None

    def cut_node(self, name: str) -> None:
        """The node dies as a machine does: its network goes (nothing it runs reaches this machine any
        more, nor it them) and its slurmd is killed. restore_node brings it back."""
        node = self.node(name)
        _run("ip", "link", "set", node.link, "down")
        self.kill_node(name)

    def restore_node(self, name: str, timeout: float = START_TIMEOUT) -> None:
        """After cut_node: the network back (the kernel dropped the route with the link) and slurmd
        started again; returns once the node is idle."""
        node = self.node(name)
        _run("ip", "link", "set", node.link, "up")
        _run("ip", "route", "replace", f"{node.address}/32", "dev", node.link)
        self.start_node(name, timeout=timeout)

    def start_node(self, name: str, timeout: float = START_TIMEOUT) -> None:
        """Starts the node's slurmd again (after kill_node); returns once the node is idle again
        (ReturnToService=2 brings a DOWN node back as soon as it registers)."""
        node = self.node(name)
        if not self._slurmd_pids(node):
            self._slurmd_launch(node)
        self.wait_until_idle([name], timeout)

    def restart_controller(self, timeout: float = START_TIMEOUT) -> None:
        """Stops slurmctld cleanly (TERM: it saves its state), starts it again and returns once REST
        answers and every node that answered before is idle or busy again. Jobs survive."""
        self._slurmctld_stop(grace=15)
        self._slurmctld_start()
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(SlurmError):
                states = self.node_states()
                if states and all(
                    state.split("+")[0] in ("IDLE", "MIXED", "ALLOCATED") and "NOT_RESPONDING" not in state
                    for state in states.values()
                ) and self.rest_answers():
                    return
            if time.monotonic() > deadline:
                raise SlurmError(f"slurmctld did not come back in {timeout}s:\n{self.log_tail('slurmctld.log')}")
            time.sleep(0.05)

    def stop_rest(self) -> None:
        """Stops slurmrestd: rest_url refuses connections until start_rest()."""
        if self._slurmrestd is not None:
            _terminate([self._slurmrestd.pid], grace=5)
            self._slurmrestd.wait()
            self._slurmrestd = None

    def start_rest(self) -> None:
        """Starts slurmrestd again on the same port; returns once it answers."""
        if self._slurmrestd is None:
            self._slurmrestd_start()

    # -- images --

    def rootfs_for(self, image_reference: str) -> Path:
        """The root filesystem of `image_reference` (on this machine's Docker engine) as a real directory
        that every node sees, for an OCI bundle's root.path. Exported once per image (docker create, then
        docker export | tar -x) and kept in ROOTFS_CACHE across sessions; an export whose image id no
        longer matches the reference is made again. Returns its path.

        Raises SlurmUnavailable when docker is missing, SlurmError when the image is unknown or the export
        fails.
        """
        return rootfs_export(image_reference)

    # -- internals --

    def _check_addresses_free(self) -> None:
        ours = ipaddress.ip_network(f"10.232.{self.slot}.0/24")
        for line in _run("ip", "-4", "-o", "addr", "show").stdout.splitlines():
            parts = line.split()
            interface, address = parts[1], parts[3]
            if ipaddress.ip_interface(address).network.overlaps(ours):
                raise SlurmUnavailable(f"{address} on {interface} overlaps the cluster's test subnet {ours}")

    def _write_files(self) -> None:
        directory = self.directory
        # Every parent must be searchable by nobody (slurmrestd) and by munge's clients.
        SLURM_ROOT.mkdir(parents=True, exist_ok=True)
        SLURM_ROOT.chmod(0o755)
        directory.mkdir(mode=0o755)
        for sub in ("etc", "log", "state", "mrun", "munge", "oci/state"):
            (directory / sub).mkdir(parents=True, mode=0o755, exist_ok=True)
        _write(directory / "munge" / "munge.key", secrets.token_bytes(1024), 0o400)
        _write(directory / "etc" / "jwt.key", secrets.token_bytes(32), 0o600)
        render_gid = grp.getgrnam("render").gr_gid
        for node in self.nodes:
            dev = self.device_dir(node)
            (dev / "dri").mkdir(parents=True)
            os.mknod(dev / "kfd", 0o660 | 0o020000, os.makedev(KFD_MAJOR, KFD_MINOR))
            for i, path in enumerate(self.render_node_paths(node)):
                os.mknod(path, 0o660 | 0o020000, os.makedev(RENDER_MAJOR, FIRST_RENDER_MINOR + i))
            for path in [dev / "kfd", *self.render_node_paths(node)]:
                os.chown(path, 0, render_gid)
                os.chmod(path, 0o660)
            (directory / "nodes" / node.name / "spool").mkdir(parents=True)
        etc = directory / "etc"
        last = FIRST_RENDER_MINOR + self.gpus_per_node - 1
        node_lines = "\n".join(
            f"NodeName={node.name} NodeAddr={node.address} CPUs=16 RealMemory=4000 "
            f"Gres={GRES_NAME}:{self.gpus_per_node} State=UNKNOWN"
            for node in self.nodes
        )
        _write(
            self.conf_path,
            f"""# Written by tests/support/slurm.py for slot {self.slot}.
ClusterName=devcloud{self.slot}
SlurmctldHost={socket.gethostname().split(".")[0]}({self.controller_address})
SlurmctldPort={self.slurmctld_port}
SlurmdPort={SLURMD_PORT}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={self.munge_socket}
AuthAltTypes=auth/jwt
AuthAltParameters=jwt_key={etc / "jwt.key"}
StateSaveLocation={directory / "state"}
SlurmctldPidFile={directory / "slurmctld.pid"}
SlurmctldLogFile={self.log_dir / "slurmctld.log"}
SlurmdSpoolDir={directory / "nodes" / "%n" / "spool"}
SlurmdPidFile={directory / "nodes" / "%n" / "slurmd.pid"}
SlurmdLogFile={self.log_dir / "slurmd-%n.log"}
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/cgroup
TaskPlugin=task/cgroup
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
ReturnToService=2
SlurmdParameters=config_overrides
GresTypes={GRES_NAME}
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
MailProg=/bin/true
# Short timeouts so a dead node is noticed as soon as Slurm allows (about 25 s whatever is set here).
SlurmdTimeout=5
MessageTimeout=5
KillWait=2
# Schedule a submitted job at once rather than in the next batch (about 2.5 s later otherwise).
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0
InactiveLimit=0
{node_lines}
PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""",
        )
        _write(
            etc / "gres.conf",
            "".join(
                f"NodeName={node.name} Name={GRES_NAME} "
                f"File={self.device_dir(node) / 'dri'}/renderD[{FIRST_RENDER_MINOR}-{last}]\n"
                for node in self.nodes
            ),
        )
        _write(
            etc / "cgroup.conf",
            "CgroupPlugin=cgroup/v1\nConstrainDevices=yes\nConstrainCores=no\nConstrainRAMSpace=no\n",
        )
        # --rootless=true even as root: without it runc writes "c *:* m" to devices.allow, which a child
        # cgroup of the job's (deny rules) may not. %u, not %U: %U is fatal in 22.05.
        runc = f"runc --rootless=true --root={self.oci_state_dir}"
        container = "%n.%u.%j.%s.%t"
        _write(
            etc / "oci.conf",
            f'RunTimeQuery="{runc} state {container}"\n'
            f'RunTimeKill="{runc} kill -a {container}"\n'
            f'RunTimeDelete="{runc} delete --force {container}"\n'
            f'RunTimeRun="{OCI_RUN} %b %r {container} {self.oci_state_dir}"\n',
        )

    def _munged_start(self) -> None:
        munge = self.directory / "munge"
        with open(self.log_dir / "munged.out", "ab") as out:
            subprocess.run(
                [
                    "munged",
                    f"--key-file={munge / 'munge.key'}",
                    f"--socket={self.munge_socket}",
                    f"--pid-file={munge / 'munged.pid'}",
                    f"--log-file={self.log_dir / 'munged.log'}",
                    f"--seed-file={munge / 'munged.seed'}",
                    "--force",
                ],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, check=False, timeout=30,
            )
        # munged daemonizes and returns once its socket listens.
        if not self.munge_socket.exists():
            raise SlurmError(f"munged did not start:\n{self.log_tail('munged.log')}{self.log_tail('munged.out')}")

    def _network_up(self, node: SlurmNode) -> None:
        inner = f"{node.link}p"
        _run("ip", "netns", "add", node.netns)
        _run("ip", "link", "add", node.link, "type", "veth", "peer", "name", inner)
        _run("ip", "link", "set", inner, "netns", node.netns)
        _run("ip", "-n", node.netns, "link", "set", inner, "name", "eth0")
        # Point to point: the same controller address on every link and a host route per node, so no
        # bridge (which br_netfilter and Docker's FORWARD DROP would filter).
        _run("ip", "addr", "add", f"{self.controller_address}/32", "dev", node.link)
        _run("ip", "link", "set", node.link, "up")
        _run("ip", "route", "add", f"{node.address}/32", "dev", node.link)
        _run("ip", "-n", node.netns, "addr", "add", f"{node.address}/24", "dev", "eth0")
        _run("ip", "-n", node.netns, "link", "set", "lo", "up")
        _run("ip", "-n", node.netns, "link", "set", "eth0", "up")

    def _daemon(self, command: list[str], log_name: str, env=None) -> subprocess.Popen:
        with open(self.log_dir / log_name, "ab") as out:
            return subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True, env=env,
            )

    def _slurmctld_start(self) -> None:
        # -D: in the foreground, so it is our child and its end is seen at once.
        self._slurmctld = self._daemon(
            ["slurmctld", "-D", "-f", str(self.conf_path)], "slurmctld.out", env=self.environment
        )

    def _slurmctld_stop(self, grace: float) -> None:
        pids = [pid for pid in _pids_mentioning(str(self.conf_path)) if _comm(pid) == "slurmctld"]
        _terminate(pids, grace=grace)
        if self._slurmctld is not None:
            self._slurmctld.wait()
            self._slurmctld = None

    def _slurmd_launch(self, node: SlurmNode) -> None:
        # nsenter --net, never `ip netns exec`: the latter remounts /sys and hides the cgroup hierarchies.
        node._process = self._daemon(
            ["nsenter", f"--net=/run/netns/{node.netns}", "slurmd", "-D", "-f", str(self.conf_path), "-N", node.name],
            f"slurmd-{node.name}.out",
            env=self.environment,
        )

    def _slurmd_pids(self, node: SlurmNode) -> list[int]:
        return [
            pid for pid in _pids_mentioning(str(self.conf_path))
            if _comm(pid) == "slurmd" and f" -N {node.name} " in _cmdline(pid) + " "
        ]

    def _slurmrestd_start(self) -> None:
        if not self.rest_port:
            self.rest_port = _free_port()
        # slurmrestd refuses to run as root; SLURM_JWT=daemon makes it pass each request's token on.
        self._slurmrestd = self._daemon(
            [
                "slurmrestd", "-f", str(self.conf_path), "-u", REST_USER, "-g", "nogroup",
                "-a", "rest_auth/jwt", "-s", "openapi/v0.0.38,openapi/v0.0.37,openapi/v0.0.36",
                f"127.0.0.1:{self.rest_port}",
            ],
            "slurmrestd.log",
            env={**self.environment, "SLURM_JWT": "daemon"},
        )
        deadline = time.monotonic() + START_TIMEOUT
        while not self.rest_answers():
            if self._slurmrestd.poll() is not None or time.monotonic() > deadline:
                raise SlurmError(f"slurmrestd did not start:\n{self.log_tail('slurmrestd.log')}")
            time.sleep(0.02)

    def _clean_leftovers(self) -> None:
        """Stops and removes everything of this slot: a running cluster's or a crashed run's."""
        directory = self.directory
        conf = str(self.conf_path)
        ours = _pids_mentioning(conf)
        ctld = [pid for pid in ours if _comm(pid) == "slurmctld"]
        slurmds = [pid for pid in ours if _comm(pid) == "slurmd"]
        if ctld and slurmds:
            # Jobs first, while slurmctld and the slurmds can still end them (runc deletes containers).
            with contextlib.suppress(SlurmError):
                live = [str(job["id"]) for job in self.squeue(timeout=3)]
                if live:
                    _run("scancel", "--full", *live, check=False, timeout=5, env=self.environment)
                deadline = time.monotonic() + 5
                while self.squeue(timeout=3) and time.monotonic() < deadline:
                    time.sleep(0.1)
        # The slurmds while slurmctld still answers: one that cannot reach it ignores TERM for about 10 s.
        _terminate(slurmds, grace=5)
        # Its state is thrown away with the directory, so no need to wait for it to be saved.
        _terminate(ctld, grace=0.5)
        _terminate([pid for pid in ours if _comm(pid) not in ("slurmctld", "slurmd")], grace=3)
        for process in (self._slurmctld, self._slurmrestd, *(node._process for node in self.nodes)):
            if process is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(timeout=5)
        self._slurmctld = self._slurmrestd = None
        for node in self.nodes:
            node._process = None
        munged = _pids_mentioning(str(directory / "munge" / "munge.key"))
        _terminate(munged, grace=3)
        # Whatever still runs on a node (a stepd or container a killed slurmd left) is in its namespace.
        namespaces = [name for name in netns_names() if name.startswith(self.netns_prefix)]
        for netns in namespaces:
            pids = _run("ip", "netns", "pids", netns, check=False).stdout.split()
            _terminate([int(pid) for pid in pids], grace=1)
        # Slurm's job cgroups (slurm_<node>/...), which it leaves behind when a container's cgroup still
        # existed as it cleaned up, and runc's (<node>.<user>.<job>...) of containers a dead slurmd left.
        for pattern in (f"slurm_{self.node_prefix}*", f"{self.node_prefix}*.*"):
            for top in {path.name for path in Path("/sys/fs/cgroup").glob(f"*/{pattern}") if path.is_dir()}:
                _remove_cgroups(top)
        for netns in namespaces:
            # The veth pair goes with its namespace end.
            _run("ip", "netns", "del", netns, check=False)
        # `ip netns add` mounted /run/netns; unmount it only when no namespace of anyone is left.
        with contextlib.suppress(OSError):
            if not os.listdir("/run/netns") and _is_mount_point("/run/netns"):
                _run("umount", "/run/netns", check=False)
        if directory.exists():
            shutil.rmtree(directory, ignore_errors=True)


def _comm(pid: int) -> str:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/comm").read_text().strip()
    return ""


def _cmdline(pid: int) -> str:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    return ""


def _is_mount_point(path: str) -> bool:
    return any(line.split()[4] == path for line in Path("/proc/self/mountinfo").read_text().splitlines())


def check_machine() -> None:
    """Raises SlurmUnavailable when this machine cannot run a cluster (not root, a tool or group missing,
    no cgroup v1 devices hierarchy)."""
    if os.geteuid() != 0:
        raise SlurmUnavailable("a Slurm test cluster needs root (network namespaces, mknod, cgroups)")
    missing = sorted({f"{tool} (Debian package {package})" for tool, package in TOOLS.items()
                      if shutil.which(tool) is None})
    if missing:
        raise SlurmUnavailable(f"missing {', '.join(missing)}: scripts/test-services.sh installs them")
    # slurmctld's auth/jwt (slurmrestd's tokens) is a package of its own in Debian 12.
    if not list(Path("/usr/lib").glob("*/slurm-wlm/auth_jwt.so")):
        raise SlurmUnavailable("slurmctld's auth/jwt plugin is missing: install the Debian package slurm-wlm-jwt-plugin")
    try:
        grp.getgrnam("render")
    except KeyError:
        # The group amdgpu's udev rules make; on a machine without GPUs nothing has made it yet.
        made = subprocess.run(["groupadd", "--system", "render"], check=False, capture_output=True, text=True)
        if made.returncode != 0:
            raise SlurmUnavailable(
                f"no `render` group for the stand-in GPUs, and `groupadd --system render` failed: "
                f"{made.stderr.strip()}"
            ) from None
    if not Path("/sys/fs/cgroup/devices/devices.allow").exists():
        raise SlurmUnavailable("no cgroup v1 devices hierarchy at /sys/fs/cgroup/devices (ConstrainDevices)")


# --- Image root filesystems -------------------------------------------------------------------------------


def rootfs_export(image_reference: str) -> Path:
    """See SlurmCluster.rootfs_for."""
    if shutil.which("docker") is None:
        raise SlurmUnavailable("docker is missing: scripts/test-services.sh installs it")
    inspect = _run("docker", "image", "inspect", "--format", "{{.Id}}", image_reference, check=False)
    if inspect.returncode != 0:
        raise SlurmError(f"no image {image_reference} on this machine's engine: {inspect.stderr.strip()}")
    image_id = inspect.stdout.strip()
    ROOTFS_CACHE.mkdir(parents=True, exist_ok=True)
    key = re.sub(r"[^A-Za-z0-9_.-]", "_", image_reference)
    target = ROOTFS_CACHE / key
    marker = ROOTFS_CACHE / f"{key}.image-id"
    # One export per image at a time, whichever session asks.
    with open(ROOTFS_CACHE / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.is_dir() and marker.exists() and marker.read_text().strip() == image_id:
            return target
        staging = ROOTFS_CACHE / f"{key}.partial-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        container = _run("docker", "create", image_reference).stdout.strip()
        try:
            export = subprocess.Popen(["docker", "export", container], stdout=subprocess.PIPE)
            untar = subprocess.run(
                ["tar", "-x", "-C", str(staging), "--numeric-owner"], stdin=export.stdout,
                capture_output=True, timeout=600, check=False,
            )
            export.stdout.close()
            if export.wait(timeout=60) != 0 or untar.returncode != 0:
                shutil.rmtree(staging, ignore_errors=True)
                raise SlurmError(f"export of {image_reference} failed: {untar.stderr.decode()[-2000:]}")
        finally:
            _run("docker", "rm", "-f", container, check=False)
        # A real directory in place (runc rejects a symlinked rootfs), swapped in whole.
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
        marker.write_text(image_id)
        return target


# --- pytest fixtures --------------------------------------------------------------------------------------
# One cluster per test process, however many conftest or test modules import the fixture: pytest makes a
# session fixture per module that defines it, so the cluster itself lives here.

CLUSTER_NODES = 2
_cluster: SlurmCluster | None = None
_unavailable: str | None = None


def _missing(reason: str):
    """Skips the test with `reason`, or fails it under CI (CI=true), where a missing part is a bug of the
    machine's setup, never a reason to pass quietly."""
    import pytest

    if os.environ.get("CI", "").lower() in ("true", "1", "yes"):
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)


def slurm_cluster_get() -> SlurmCluster:
    """The process's cluster, started on first use. Skips (fails under CI) when this machine cannot run
    one."""
    global _cluster, _unavailable
    if _unavailable:
        _missing(_unavailable)
    if _cluster is None:
        try:
            _cluster = SlurmCluster.start(nodes=CLUSTER_NODES)
        except SlurmUnavailable as error:
            _unavailable = f"no Slurm test cluster on this machine: {error}"
            _missing(_unavailable)
    return _cluster


def slurm_cluster_stop() -> None:
    global _cluster
    if _cluster is not None:
        _cluster.stop()
        _cluster = None


@session_fixture
def slurm_cluster_fixture():
    """The running SlurmCluster: two idle nodes of eight stand-in GPUs each, partition "gpu"."""
    yield slurm_cluster_get()
    slurm_cluster_stop()
