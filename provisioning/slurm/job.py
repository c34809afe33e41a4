"""The Slurm batch job that runs a DevCloud image as an instance: `srun --container` with runc.

batch_script() is the script, job_request() the `job` dict of a slurmrestd submission; submit both with
SlurmRest.submit(script=..., job=...). On the node the script
  1. makes the job's directory <run_dir>/<job id>/ with an OCI bundle (bundle/config.json), a home
     (home/, owned by uid 1000) and keys/authorized_keys holding the given keys (owned by root, bound
     read-only at /etc/devcloud/ssh/keys, where the image's sshd_config looks), and creates the
     workspace directory (owned by uid 1000) when it does not exist;
  2. picks two free TCP ports, for JupyterLab and sshd, and starts `srun --container=<bundle> <tini> -s --
     <start script>` with JUPYTER_IP=0.0.0.0 and the ports in JUPYTER_PORT and DEVCLOUD_SSH_PORT. Only the
     variables the image's entrypoint reads go into the container (srun --export), never the callback
     token;
  3. waits until the container listens on both ports with sockets of its own (held by a process in the
     job's cgroup). A port picked free can be taken by another program before the container binds it:
     JupyterLab then exits, or sshd does not listen; the script stops the container and goes back to 2
     with new ports, up to PORT_ATTEMPTS times;
  4. POSTs {"node", "jupyter_port", "ssh_port", "job_id"} as JSON to the callback URL with
     `Authorization: Bearer <callback token>` (a failure is logged in the job's output, not fatal: the
     portal can still find the job through REST). JupyterLab answers at http://<node address>:<port><base
     url> from then on; the report is also the portal's sign that JupyterLab listens.

The container (config.json): root.path is the shared root filesystem, read-only; uid 1000 with the
group ids of the node's render devices; the node's network (no network namespace); /workspace, the home,
the keys (read-only), /dev/kfd and /dev/dri bound in, tmpfs /tmp and /dev/shm; no capabilities. Its one devices rule allows
everything: its cgroup nests under the job step's, so Slurm's ConstrainDevices still decides which GPUs
open. The GPU variables (ROCR_VISIBLE_DEVICES, HIP_VISIBLE_DEVICES, CUDA_VISIBLE_DEVICES,
GPU_DEVICE_ORDINAL) are passed in from the batch environment, since Slurm does not set them inside a
container.

What the cluster must provide:
  - GRES `gpu` (or the name given) for the GPUs, with `File=` their render nodes, ConstrainDevices=yes in
    cgroup.conf, and /dev/kfd readable by the render group on every node;
  - python3 on the nodes (the script's helper), and runc;
  - oci.conf next to slurm.conf, with runc in rootless mode even when jobs run as root (a child cgroup
    may not widen the job's device rules, which runc tries without --rootless), and `%u`, not `%U`
    (fatal in 22.05):
        RunTimeQuery="runc --rootless=true --root=<state dir> state %n.%u.%j.%s.%t"
        RunTimeKill="runc --rootless=true --root=<state dir> kill -a %n.%u.%j.%s.%t"
        RunTimeDelete="runc --rootless=true --root=<state dir> delete --force %n.%u.%j.%s.%t"
        RunTimeRun="runc --rootless=true --root=<state dir> run %n.%u.%j.%s.%t -b %b"
  - the image's root filesystem as a real directory (runc rejects a symlink) on storage every node sees,
    like run_dir and the workspace;
  - jobs that may not be requeued: job_request() asks for that (`no_requeue`: 22.05's REST takes
    `"requeue": false` as a request *to* requeue), so a node that dies ends the instance's job (NODE_FAIL)
    instead of starting it again elsewhere behind the portal's back.

The driver removes a job's directory once the instance has ended (provisioning/drivers/slurm.py), when
the portal sees run_dir; the job's output (<run_dir>/<job id>.out) stays for the operators.
"""

import shlex

# The image's PATH (Slurm replaces the container's environment with the job's, so it must be the job's).
IMAGE_PATH = "/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
TINI = "/usr/bin/tini"
START_SCRIPT = "/usr/local/bin/start-jupyter.sh"
CONTAINER_UID = 1000
CONTAINER_HOME = "/home/developer"
# The node's device directory on a real cluster; a test cluster's nodes each have their own, named with
# this placeholder for the node's name.
NODE_PLACEHOLDER = "{node}"
GPU_VARIABLES = ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL")
# What the container's environment holds (besides Slurm's own SLURM_* variables).
# How many times the job starts its container on newly picked ports when a port was taken meanwhile.
PORT_ATTEMPTS = 5
CONTAINER_VARIABLES = (
    "PATH", "HOME", "LANG", "SHELL", "JUPYTER_TOKEN", "JUPYTER_BASE_URL", "JUPYTER_IP", "JUPYTER_PORT",
    "DEVCLOUD_SSH_PORT", *GPU_VARIABLES,
)

# Runs on the node with python3: writes the bundle and the home. Prints the bundle's directory.
_NODE_HELPER = r'''
import json, os, sys

env = os.environ
job_id, node = env["SLURM_JOB_ID"], env["SLURMD_NODENAME"]
uid = int(env["DEVCLOUD_CONTAINER_UID"])
devices = env["DEVCLOUD_DEVICE_DIR"].replace("{node}", node)
job_dir = os.path.join(env["DEVCLOUD_RUN_DIR"], job_id)
bundle, home = os.path.join(job_dir, "bundle"), os.path.join(job_dir, "home")


GPU_VARIABLES = {gpu_variables!r}


for path in (bundle, os.path.join(home, ".ssh")):
    os.makedirs(path, exist_ok=True)
workspace = env["DEVCLOUD_WORKSPACE"]
if not os.path.isdir(workspace):
    os.makedirs(workspace)
    os.chown(workspace, uid, uid)
os.chmod(os.path.join(home, ".ssh"), 0o700)
os.chmod(home, 0o750)
for path in (home, os.path.join(home, ".ssh")):
    os.chown(path, uid, uid)
# The keys sshd trusts: root's, bound read-only over the image's /etc/devcloud/ssh/keys, so the tenant
# (uid 1000) cannot add one of their own.
key_dir = os.path.join(job_dir, "keys")
os.makedirs(key_dir, exist_ok=True)
keys = os.path.join(key_dir, "authorized_keys")
with open(keys, "w") as handle:
    handle.write(env.get("DEVCLOUD_AUTHORIZED_KEYS", ""))
for path, mode in ((key_dir, 0o755), (keys, 0o644)):
    os.chown(path, 0, 0)
    os.chmod(path, mode)

# The render group of this node's devices, whatever its gid here.
device_paths = [os.path.join(devices, "kfd")]
dri = os.path.join(devices, "dri")
if os.path.isdir(dri):
    device_paths += [os.path.join(dri, name) for name in sorted(os.listdir(dri))]
gids = sorted({os.stat(path).st_gid for path in device_paths if os.path.exists(path)} - {0})


def bind(source, destination, *options):
    return {"destination": destination, "type": "bind", "source": source,
            "options": ["rbind", "nosuid", *options]}


config = {
    "ociVersion": "1.0.2",
    "process": {
        "terminal": False,
        "user": {"uid": uid, "gid": uid, "additionalGids": gids},
        # Slurm puts the srun command and the job step's environment here.
        "args": ["/bin/true"],
        # Slurm 22.05 appends the step's environment (srun --export) to this; later versions replace it.
        "env": ["PATH=" + env["PATH"]] + [
            f"{name}={env[name]}" for name in GPU_VARIABLES if name in env
        ],
        "cwd": "/",
        "capabilities": {"bounding": [], "effective": [], "permitted": [], "inheritable": [], "ambient": []},
        "noNewPrivileges": True,
    },
    "root": {"path": env["DEVCLOUD_ROOTFS"], "readonly": True},
    "hostname": node,
    "mounts": [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
         "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
        {"destination": "/dev/pts", "type": "devpts", "source": "devpts",
         "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"]},
        {"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
         "options": ["nosuid", "nodev", "mode=1777", "size=" + env.get("DEVCLOUD_SHM_MB", "1024") + "m"]},
        {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue",
         "options": ["nosuid", "noexec", "nodev"]},
        {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]},
        {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev", "mode=1777"]},
        bind(workspace, "/workspace", "nodev"),
        bind(home, env["HOME"], "nodev"),
        bind(key_dir, "/etc/devcloud/ssh/keys", "nodev", "ro"),
        bind(os.path.join(devices, "kfd"), "/dev/kfd"),
        bind(dri, "/dev/dri"),
    ],
    "linux": {
        # Nested under the job step's cgroup, whose device rules (the job's GPUs only) still apply.
        "resources": {"devices": [{"allow": True, "access": "rwm"}]},
        "namespaces": [{"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}],
        "maskedPaths": ["/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
                        "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/sys/firmware",
                        "/proc/scsi"],
        "readonlyPaths": ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"],
    },
}
with open(os.path.join(bundle, "config.json"), "w") as handle:
    json.dump(config, handle, indent=1)

print(bundle)
'''


# Runs on the node with python3 before each attempt to start the container: prints two ports that are
# free now, "<jupyter port> <ssh port>" (ssh 0 without sshd). They may be taken before the container
# binds them; _CONFIRM finds out and the script tries again with others.
_PICK_PORTS = r'''
import os, socket

def free_port():
    with socket.socket() as probe:
        probe.bind(("0.0.0.0", 0))
        return probe.getsockname()[1]

ports = [free_port(), free_port() if os.environ.get("DEVCLOUD_SSH") == "1" else 0]
while ports[1] == ports[0]:
    ports[1] = free_port()
print(*ports)
'''


# Runs on the node with python3 beside the starting container: waits until JupyterLab (and sshd) listen
# on the picked ports, and proves that the listening sockets are this job's own (held by a process in the
# job's cgroup), not another program's that took a port between the pick and the container's bind. Then
# reports node and ports to the portal and exits 0. Exits 3 when the container ended first (JupyterLab
# exits when its port is taken) or sshd's port is someone else's: the script tries other ports.
# argv: jupyter port, ssh port (0: none), pid of srun.
_CONFIRM = r'''
import json, os, sys, time, urllib.request

env = os.environ
job_id, node = env["SLURM_JOB_ID"], env["SLURMD_NODENAME"]
jupyter_port, ssh_port, srun = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
wanted = [port for port in (jupyter_port, ssh_port) if port]
# How long sshd (started before JupyterLab) may still take once JupyterLab listens.
SSH_GRACE = 2.0


def job_cgroups():
    # Every cgroup hierarchy's directory of this job: the container's processes nest under it.
    mounts = {}
    with open("/proc/self/mountinfo") as lines:
        for line in lines:
            fields = line.split()
            kind = fields[fields.index("-") + 1]
            if kind == "cgroup2":
                mounts[""] = fields[4]
            elif kind == "cgroup":
                for option in fields[-1].split(","):
                    mounts[option] = fields[4]
    found, marker = set(), f"/job_{job_id}"
    with open("/proc/self/cgroup") as lines:
        for line in lines:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            if marker not in path:
                continue
            path = path[: path.index(marker) + len(marker)]
            for controller in controllers.split(",") if controllers else [""]:
                if controller in mounts:
                    found.add(mounts[controller] + path)
    return sorted(found)


def job_sockets(cgroups):
    # The socket inodes the job's processes hold; None when some process's descriptors are unreadable.
    pids = set()
    for top in cgroups:
        for directory, _, _ in os.walk(top):
            try:
                with open(os.path.join(directory, "cgroup.procs")) as procs:
                    pids.update(procs.read().split())
            except OSError:
                pass
    inodes, blind = set(), False
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except PermissionError:
            blind = True
        except OSError:
            pass
    return None if blind else inodes


def listening():
    # {port: {socket inode}} of the listening TCP sockets on the wanted ports, in this node's network.
    found = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as lines:
                next(lines)
                for line in lines:
                    fields = line.split()
                    port = int(fields[1].rsplit(":", 1)[1], 16)
                    if fields[3] == "0A" and port in wanted:
                        found.setdefault(port, set()).add(fields[9])
        except OSError:
            pass
    return found


def srun_alive():
    try:
        with open(f"/proc/{srun}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


cgroups = job_cgroups()
jupyter_since = None
while True:
    if not srun_alive():
        print(f"devcloud: the container ended before JupyterLab listened on port {jupyter_port}", file=sys.stderr)
        sys.exit(3)
    listeners = listening()
    ours = set()
    if listeners:
        sockets = job_sockets(cgroups) if cgroups else None
        for port, inodes in listeners.items():
            # Every listener on the port must be the job's: sshd binds IPv6 even when another program
            # holds the port on IPv4, where the portal connects. Without a view of the job's sockets, a
            # listener on a port the container is starting on counts.
            if sockets is None or inodes <= sockets:
                ours.add(port)
    if jupyter_port in ours:
        jupyter_since = jupyter_since or time.monotonic()
        if not ssh_port or ssh_port in ours:
            break
        if time.monotonic() - jupyter_since > SSH_GRACE:
            print(f"devcloud: sshd does not listen on port {ssh_port} (taken by another program?)", file=sys.stderr)
            sys.exit(3)
    time.sleep(0.05)

url = env.get("DEVCLOUD_CALLBACK_URL")
if url:
    body = {"node": node, "jupyter_port": jupyter_port, "ssh_port": ssh_port or None, "job_id": int(job_id)}
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST", headers={
        "Content-Type": "application/json",
        "Authorization": "Bearer " + env.get("DEVCLOUD_CALLBACK_TOKEN", ""),
    })
    try:
        urllib.request.urlopen(request, timeout=10).close()
    except Exception as error:
        print(f"devcloud: callback to {url} failed: {error}", file=sys.stderr)
'''


# Runs on the node beside the container, in the job's cgroup, for as long as the job: every
# DEVCLOUD_HEARTBEAT_SECONDS it reports again, which is how DevCloud knows the node still runs the job (a
# node that dies stops reporting; Slurm notices only later), with gpu_busy_percent of the job's own GPUs,
# for idle culling. Its own GPUs are the render nodes the job's devices cgroup lets it open (no EPERM).
_HEARTBEAT = r'''
import errno, json, os, sys, time, urllib.request

env = os.environ
job_id, node = env["SLURM_JOB_ID"], env["SLURMD_NODENAME"]
jupyter_port, ssh_port = int(sys.argv[1]), int(sys.argv[2])
dri = os.path.join(env["DEVCLOUD_DEVICE_DIR"].replace("{node}", node), "dri")
own = []
for name in sorted(os.listdir(dri)) if os.path.isdir(dri) else []:
    if not name.startswith("renderD"):
        continue
    try:
        os.close(os.open(os.path.join(dri, name), os.O_RDWR))
    except OSError as error:
        if error.errno in (errno.EPERM, errno.EACCES):
            continue
    own.append(name)


def busy(name):
    try:
        with open(f"/sys/class/drm/{name}/device/gpu_busy_percent") as reading:
            return int(reading.read().strip())
    except (OSError, ValueError):
        return None


every = max(1, int(env.get("DEVCLOUD_HEARTBEAT_SECONDS", "30")))
url, token = env["DEVCLOUD_CALLBACK_URL"], env.get("DEVCLOUD_CALLBACK_TOKEN", "")
while True:
    time.sleep(every)
    body = {"node": node, "jupyter_port": jupyter_port, "ssh_port": ssh_port or None, "job_id": int(job_id),
            "gpu_busy": {name: busy(name) for name in own}}
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST", headers={
        "Content-Type": "application/json", "Authorization": "Bearer " + token})
    try:
        urllib.request.urlopen(request, timeout=10).close()
    except urllib.error.HTTPError as error:
        if error.code in (403, 404):
            break  # DevCloud is done with this job
    except Exception as error:
        print(f"devcloud: heartbeat to {url} failed: {error}", file=sys.stderr, flush=True)
'''


def batch_script(*, tini: str = TINI, start_script: str = START_SCRIPT) -> str:
    """Returns the text of the batch script (the same for every instance: everything that differs comes
    in the job's environment, see job_request). `tini` and `start_script` are paths inside the image
    (its Entrypoint)."""
    export = ",".join(CONTAINER_VARIABLES)
    helper = _NODE_HELPER.replace("{gpu_variables!r}", repr(GPU_VARIABLES))
    return f"""#!/bin/bash
# DevCloud instance: the image's JupyterLab in an OCI container on this node (srun --container, runc).
set -euo pipefail
bundle=$(python3 -c {shlex.quote(helper)})
unset DEVCLOUD_AUTHORIZED_KEYS
export JUPYTER_IP=0.0.0.0
# A port picked free can be taken before the container binds it: the job reports its ports only once
# they are its own, and otherwise starts the container again on others.
for attempt in $(seq 1 {PORT_ATTEMPTS}); do
  read -r jupyter_port ssh_port < <(python3 -c {shlex.quote(_PICK_PORTS)})
  export JUPYTER_PORT=$jupyter_port
  if [ "$ssh_port" != 0 ]; then export DEVCLOUD_SSH_PORT=$ssh_port; else unset DEVCLOUD_SSH_PORT; fi
  echo "devcloud: job $SLURM_JOB_ID on $SLURMD_NODENAME, JupyterLab on port $jupyter_port, sshd on $ssh_port (attempt $attempt)"
  env -u DEVCLOUD_CALLBACK_TOKEN srun --export={export} --container="$bundle" {shlex.quote(tini)} -s -- {shlex.quote(start_script)} &
  container=$!
  confirmed=0
  python3 -c {shlex.quote(_CONFIRM)} "$jupyter_port" "$ssh_port" "$container" </dev/null || confirmed=$?
  if [ "$confirmed" = 0 ]; then
    if [ -n "${{DEVCLOUD_CALLBACK_URL:-}}" ]; then
      python3 -c {shlex.quote(_HEARTBEAT)} "$jupyter_port" "$ssh_port" </dev/null &
    fi
    unset DEVCLOUD_CALLBACK_TOKEN
    status=0
    wait "$container" || status=$?
    exit "$status"
  fi
  kill -TERM "$container" 2>/dev/null || true
  wait "$container" || true
done
echo "devcloud: JupyterLab and sshd could not get their ports in {PORT_ATTEMPTS} attempts; see above" >&2
exit 1
"""


def job_request(
    *,
    name: str,
    gpus: int,
    time_limit_minutes: int,
    jupyter_token: str,
    jupyter_base_url: str,
    rootfs: str,
    workspace_dir: str,
    run_dir: str,
    callback_url: str,
    callback_token: str,
    authorized_keys: str = "",
    ssh: bool = True,
    partition: str | None = None,
    gres_name: str = "gpu",
    device_dir: str = "/dev",
    path: str = IMAGE_PATH,
    container_uid: int = CONTAINER_UID,
    cpus: int | None = None,
    memory_mb: int | None = None,
    shm_mb: int = 1024,
    heartbeat_seconds: int = 30,
) -> dict:
    """Returns the `job` dict of a submission of batch_script() for one instance.

    name            the job's name, derived from the instance, so a retried submission finds its job
                    (SlurmRest.find_job) instead of making a second one
    gpus            GPUs on one node (`--gres=<gres_name>:<gpus>`)
    time_limit_minutes  Slurm ends the job after this
    rootfs          the image's root filesystem on shared storage (a real directory)
    workspace_dir   the user's workspace on shared storage, /workspace in the container
    run_dir         shared storage for the jobs' bundles, homes and output (<run_dir>/<job id>/...)
    device_dir      the nodes' /dev (kfd and dri/); "{node}" in it stands for the node's name
    partition       None: the cluster's default partition
    cpus, memory_mb the instance's share of the node (`--cpus-per-task`, `--mem`); None: Slurm's default
    shm_mb          the size of the container's /dev/shm
    heartbeat_seconds  how often the job reports again that it runs, with its GPUs' use
    """
    if gpus < 1:
        raise ValueError("an instance has at least one GPU")
    environment = {
        "PATH": path,
        "HOME": CONTAINER_HOME,
        "LANG": "C.UTF-8",
        "SHELL": "/bin/bash",
        "JUPYTER_TOKEN": jupyter_token,
        "JUPYTER_BASE_URL": jupyter_base_url,
        "DEVCLOUD_SSH": "1" if ssh else "0",
        "DEVCLOUD_ROOTFS": rootfs,
        "DEVCLOUD_WORKSPACE": workspace_dir,
        "DEVCLOUD_RUN_DIR": run_dir,
        "DEVCLOUD_DEVICE_DIR": device_dir,
        "DEVCLOUD_CONTAINER_UID": str(container_uid),
        "DEVCLOUD_CALLBACK_URL": callback_url,
        "DEVCLOUD_CALLBACK_TOKEN": callback_token,
        "DEVCLOUD_AUTHORIZED_KEYS": authorized_keys,
        "DEVCLOUD_SHM_MB": str(shm_mb),
        "DEVCLOUD_HEARTBEAT_SECONDS": str(heartbeat_seconds),
    }
    job = {
        "name": name,
        "gres": f"{gres_name}:{gpus}",
        "nodes": 1,
        # Present means "do not requeue" (its value is ignored); `"requeue": false` would ask for requeue.
        "no_requeue": True,
        "time_limit": time_limit_minutes,
        "current_working_directory": run_dir,
        "standard_output": f"{run_dir}/%j.out",
        "standard_error": f"{run_dir}/%j.out",
        "environment": environment,
    }
    if partition:
        job["partition"] = partition
    if cpus:
        job["cpus_per_task"] = cpus
    if memory_mb:
        job["memory_per_node"] = memory_mb
    return job
