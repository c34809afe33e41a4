from django.conf import settings
from django.db import models
from django.db.models import F, Q

from portal.lib.sealed import SealedTextField

# Kept by the database (migration 0006), never written from Python: see GpuHost.gpus_present.
GPU_COUNT_FIELDS = ("gpus_present", "gpus_free")


class SlurmCluster(models.Model):
    """A Slurm cluster DevCloud runs instances on through slurmrestd; Slurm places them (docs/slurm.md).

    Each partition DevCloud may use is a GpuHost row with backend "slurm" pointing here.
    """

    class Health(models.TextChoices):
        OK = "ok", "Answering"
        UNREACHABLE = "unreachable", "slurmrestd does not answer"
        TOKEN_REFUSED = "token_refused", "The token is refused"

    name = models.CharField(max_length=100, unique=True)
    # slurmrestd's base URL, e.g. "http://slurm-head.example:6820".
    rest_url = models.CharField(max_length=300)
    # The Slurm user the jobs run under, and its JWT (`scontrol token username=... lifespan=...`), sealed
    # (portal/lib/sealed.py): a database dump does not carry it in the clear.
    rest_user = models.CharField(max_length=100)
    token_sealed = models.TextField()
    # The GRES name the nodes give their GPUs ("gpu" in gres.conf).
    gres_name = models.CharField(max_length=50, default="gpu")
    # Directories every node sees at the same path (shared storage): image root filesystems, one
    # directory per image under image_root (its name from the image reference); the people's workspaces;
    # and each job's bundle, home and log.
    image_root = models.CharField(max_length=300)
    workspace_root = models.CharField(max_length=300)
    job_root = models.CharField(max_length=300)
    # Where a node's /dev/kfd and /dev/dri live: "/dev" on real nodes; "{node}" stands for the node's name.
    device_dir = models.CharField(max_length=300, default="/dev")
    # The portal's address as the nodes reach it, for the job's report of where it runs.
    callback_url = models.CharField(max_length=300)
    health = models.CharField(max_length=20, choices=Health.choices, default=Health.OK)
    last_error = models.TextField(blank=True, default="")
    last_seen_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name


class GpuHost(models.Model):
    """A place instances run: a machine with GPUs reached through its Docker Engine API (DevCloud's
    scheduler places on its GPUs), or a partition of a Slurm cluster (Slurm places)."""

    class Backend(models.TextChoices):
        DOCKER = "docker", "Docker host"
        SLURM = "slurm", "Slurm partition"

    class State(models.TextChoices):
        ACTIVE = "active", "Active"
        DRAINING = "draining", "Draining (no new placements)"
        DOWN = "down", "Down"
        RETIRED = "retired", "Retired"

    name = models.CharField(max_length=100, unique=True)
    backend = models.CharField(max_length=10, choices=Backend.choices, default=Backend.DOCKER)
    # For a Slurm partition: its cluster and the partition's name there.
    slurm_cluster = models.ForeignKey(
        SlurmCluster, null=True, blank=True, on_delete=models.PROTECT, related_name="partitions"
    )
    slurm_partition = models.CharField(max_length=100, blank=True, default="")
    # "unix:///var/run/docker.sock" or "tcp://gpu-01.example.com:2376".
    docker_url = models.CharField(max_length=300, default="unix:///var/run/docker.sock")
    # PEM text of the TLS client certificate, its key and the CA, for tcp:// endpoints. The key is root on
    # the host: sealed in the column (portal/lib/sealed.py), plain text on the model.
    tls_ca_cert = models.TextField(blank=True, default="")
    tls_client_cert = models.TextField(blank=True, default="")
    tls_client_key = SealedTextField(blank=True, default="")
    # Paths ON THE HOST (its engine bind-mounts them into a helper container; see provisioning/hostfs.py).
    # Root under which sys/class/kfd/... and sys/class/drm/... are read; "/" on a real host.
    sysfs_root = models.CharField(max_length=300, default="/")
    # Root under which dev/kfd and dev/dri/renderD<minor> live on the host; "/" on a real host.
    dev_root = models.CharField(max_length=300, default="/")
    # The address on the host's private network where containers publish JupyterLab, and where the
    # gateway reaches it. Never 0.0.0.0: a tenant's lab must not answer on the host's public side.
    # 127.0.0.1 for this machine's own engine (unix://). Required for tcp:// hosts.
    private_address = models.GenericIPAddressField(null=True, blank=True)
    # Group id that owns the host's /dev/kfd, as discovery last read it through the engine: containers
    # get it (with their render nodes' gids) so uid 1000 may open the GPU. Null until discovered.
    kfd_gid = models.PositiveIntegerField(null=True, blank=True)
    state = models.CharField(max_length=20, choices=State.choices, default=State.ACTIVE, db_index=True)
    # Per-GPU share of the host given to a container: what start specs use. Discovery sets each to the
    # operator's override, or else to an even share of what it read (provisioning/shares.py); an
    # operator sets them directly on a Slurm partition.
    cpus_per_gpu = models.FloatField(default=1.0)
    memory_mb_per_gpu = models.PositiveIntegerField(default=4096)
    # /dev/shm per GPU; null: half the memory share, at most 64 GiB (portal/instances/start_spec.py).
    shm_mb_per_gpu = models.PositiveIntegerField(null=True, blank=True)
    # What discovery last read of the host (null until then, or where it could not tell).
    host_cpus = models.PositiveIntegerField(null=True, blank=True)
    host_memory_mb = models.PositiveBigIntegerField(null=True, blank=True)
    host_disk_gb = models.PositiveIntegerField(null=True, blank=True)
    # An operator's per-GPU shares for this host: they win over the even share; blank: the even share.
    cpus_per_gpu_override = models.FloatField(null=True, blank=True)
    memory_mb_per_gpu_override = models.PositiveIntegerField(null=True, blank=True)
    shm_mb_per_gpu_override = models.PositiveIntegerField(null=True, blank=True)
    last_seen_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    # What the host's engine said it can limit when it was last registered or checked
    # (docker_engine.disk_limit_support; null: never asked): a workspace volume's size, and a container's
    # writable layer. The storage it reported ("overlay2 on extfs") and, when it cannot, why.
    can_limit_workspaces = models.BooleanField(null=True, blank=True)
    can_limit_writable_layers = models.BooleanField(null=True, blank=True)
    engine_storage = models.CharField(max_length=200, blank=True, default="")
    disk_limits_reason = models.TextField(blank=True, default="")
    disk_limits_checked_at = models.DateTimeField(null=True, blank=True)
    # True for a machine without AMD GPUs that `make run` registers with a KFD topology copied from a real
    # MI300X host and stand-in device nodes: launches work end to end, but no program sees a real GPU.
    # Every page that shows such a host or its instances says so.
    is_simulated = models.BooleanField(default=False)
    # Its present GPUs (not drained: migration 0008), and those of them without a live allocation: what
    # placement picks a host by,
    # without counting GPU rows. On PostgreSQL, triggers on Gpu and GpuAllocation (migration 0006) change
    # them in the same statement as any row that changes them, whoever writes it (allocate, release,
    # discovery, the admin, a test), after locking this row; save() leaves them out. On SQLite (make run)
    # they stay 0 and placement counts the rows instead.
    gpus_present = models.PositiveIntegerField(db_default=0, editable=False)
    gpus_free = models.PositiveIntegerField(db_default=0, editable=False)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(
                condition=Q(gpus_free__gte=0, gpus_free__lte=F("gpus_present")),
                name="provisioning_gpuhost_free_within_present",
            ),
        ]
        indexes = [
            # Placement's order among active hosts with a free GPU: most GPUs in use first, then fewest
            # free (provisioning.scheduler). A 1x walks it from the start; an 8x reads the range with
            # none in use and eight free, by name.
            models.Index(
                (F("gpus_present") - F("gpus_free")).desc(),
                F("gpus_free"),
                F("name"),
                F("id"),
                name="provisioning_gpuhost_packing",
                condition=Q(state="active", gpus_free__gt=0),
            ),
        ]

    def __str__(self):
        return self.name

    def save(self, **kwargs):
        # A host loaded before an allocation or a discovery would otherwise write back stale counts.
        if not self._state.adding and kwargs.get("update_fields") is None and not kwargs.get("force_insert"):
            kwargs["update_fields"] = [
                field.name
                for field in self._meta.concrete_fields
                if not field.primary_key and field.name not in GPU_COUNT_FIELDS
            ]
        super().save(**kwargs)

    @property
    def is_slurm(self) -> bool:
        return self.backend == self.Backend.SLURM


class Gpu(models.Model):
    """One GPU of a host, as KFD sysfs describes it."""

    host = models.ForeignKey(GpuHost, on_delete=models.CASCADE, related_name="gpus")
    node_id = models.PositiveIntegerField(help_text="KFD topology node index.")
    gpu_id = models.PositiveBigIntegerField(help_text="KFD gpu_id.")
    render_minor = models.PositiveIntegerField(help_text="drm_render_minor: the container gets /dev/dri/renderD<minor>.")
    location_id = models.PositiveBigIntegerField(default=0)
    unique_id = models.CharField(max_length=40, blank=True, default="")
    vram_bytes = models.PositiveBigIntegerField(default=0)
    is_present = models.BooleanField(default=True)
    # Group id that owns /dev/dri/renderD<minor> on the host (usually `render`, `video` on older
    # systems), as discovery last read it. Null until discovered, or when the node was missing.
    render_gid = models.PositiveIntegerField(null=True, blank=True)
    # GPU health (provisioning/gpu_health.py), read on every heartbeat. A drained GPU takes no new
    # placements and the host's GPU counts leave it out (migration 0008), until an operator returns it.
    is_drained = models.BooleanField(default=False)
    drained_reason = models.TextField(blank=True, default="")
    drained_at = models.DateTimeField(null=True, blank=True)
    # Sums of the "ue:" and "ce:" lines of its ras/*_err_count files at the last reading; null when the
    # driver shows no RAS counters (or before the first reading).
    ras_uncorrectable = models.PositiveBigIntegerField(null=True, blank=True)
    ras_correctable = models.PositiveBigIntegerField(null=True, blank=True)
    health_checked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["host", "node_id"]
        constraints = [
            models.UniqueConstraint(fields=["host", "node_id"], name="provisioning_gpu_node_unique"),
            models.UniqueConstraint(fields=["host", "render_minor"], name="provisioning_gpu_minor_unique"),
        ]

    def __str__(self):
        return f"{self.host.name}/renderD{self.render_minor}"


class GpuAllocation(models.Model):
    """A GPU held by an instance. The partial unique constraint means a GPU has at most one live holder."""

    gpu = models.ForeignKey(Gpu, on_delete=models.PROTECT, related_name="allocations")
    instance = models.ForeignKey("instances.Instance", on_delete=models.PROTECT, related_name="allocations")
    allocated_at = models.DateTimeField(auto_now_add=True)
    released_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["gpu"], condition=Q(released_at__isnull=True), name="provisioning_gpu_one_live_holder"
            )
        ]


class ImageJob(models.Model):
    """One "pre-pull or build this image on this host" request, and how far it got.

    Written by provisioning.images: created queued by the operator's action, moved to running by the
    Celery task provisioning.ensure_image, then to done or failed. progress_text keeps the last lines of
    build or pull output, so the console can show them while the job runs.
    """

    class State(models.TextChoices):
        QUEUED = "queued", "Queued"
        RUNNING = "running", "Running"
        DONE = "done", "Done"
        FAILED = "failed", "Failed"

    ACTIVE_STATES = (State.QUEUED, State.RUNNING)

    host = models.ForeignKey(GpuHost, on_delete=models.CASCADE, related_name="image_jobs")
    image = models.ForeignKey("instances.Image", on_delete=models.CASCADE, related_name="host_jobs")
    # The reference asked for, as the catalogue named it then (a later sync may give the image a new tag).
    reference = models.CharField(max_length=200)
    state = models.CharField(max_length=10, choices=State.choices, default=State.QUEUED, db_index=True)
    # What ensure_image reported: "present", "built" or "pulled"; empty until done.
    outcome = models.CharField(max_length=10, blank=True, default="")
    progress_text = models.TextField(blank=True, default="")
    # Build step n of m as a percentage; null while unknown (pulls report per layer, not overall).
    percent = models.PositiveSmallIntegerField(null=True, blank=True)
    # What went wrong and what the operator can do about it.
    error = models.TextField(blank=True, default="")
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # Bumped with every progress write: a running job that stops moving lost its worker.
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self):
        return f"{self.reference} on {self.host.name} ({self.state})"


class HostImage(models.Model):
    """Whether a host's engine had an image reference when it was last looked at.

    Written when an image job finishes, when the console checks a host's images, and when `make run`
    prepares this machine. Hosts without any row have never been looked at: their images are unknown,
    not missing, so nothing is refused on their account.
    """

    host = models.ForeignKey(GpuHost, on_delete=models.CASCADE, related_name="host_images")
    reference = models.CharField(max_length=200)
    present = models.BooleanField(default=False)
    checked_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["host", "reference"], name="provisioning_hostimage_unique"),
        ]

    def __str__(self):
        return f"{self.reference} on {self.host.name}: {'present' if self.present else 'missing'}"


class Workspace(models.Model):
    """Where a person's /workspace lives: the one host whose engine holds their workspace volume.

    Written by provisioning.workspaces when a container is created with the volume, and after a verified
    move to another host. The scheduler prefers this host for the person's launches (it saves a move).
    One row per person: the workspace follows them, so it is in one place at a time.
    """

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="workspace")
    host = models.ForeignKey(GpuHost, on_delete=models.CASCADE, related_name="workspaces")
    volume_name = models.CharField(max_length=200)
    # Size of its files when last measured (at a move); 0 until then.
    bytes = models.PositiveBigIntegerField(default=0)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self):
        return f"{self.volume_name} on {self.host.name}"


class WorkspaceRemoval(models.Model):
    """A host on which a deleted account's workspace volumes may still be left, to be removed.

    Written for every host when an account is deleted (provisioning.workspaces.workspaces_remove_all) and
    deleted once that host's engine shows none of the account's volumes; a host that did not answer, or
    whose volume was still in use by a container being stopped, keeps its row for the next beat.
    """

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    host = models.ForeignKey(GpuHost, on_delete=models.CASCADE, related_name="workspace_removals")
    created_at = models.DateTimeField(auto_now_add=True)
    attempts = models.PositiveIntegerField(default=0)
    # Why the last attempt left something behind.
    last_error = models.TextField(blank=True, default="")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "host"], name="provisioning_workspaceremoval_unique"),
        ]

    def __str__(self):
        return f"workspaces of user {self.user_id} on {self.host.name}"


class SlurmJob(models.Model):
    """DevCloud's own record of an instance's Slurm job. Without slurmdbd a finished job leaves Slurm's view
    after MinJobAge, so this row keeps what was last seen: where it ran, when, and how it ended."""

    instance_id = models.UUIDField(unique=True)
    host = models.ForeignKey(GpuHost, on_delete=models.PROTECT, related_name="slurm_jobs")
    name = models.CharField(max_length=200)
    job_id = models.PositiveBigIntegerField(null=True, blank=True)
    # What the job reported from its node (the callback), once it runs.
    node = models.CharField(max_length=100, blank=True, default="")
    address = models.GenericIPAddressField(null=True, blank=True)
    jupyter_port = models.PositiveIntegerField(null=True, blank=True)
    ssh_port = models.PositiveIntegerField(null=True, blank=True)
    reported_at = models.DateTimeField(null=True, blank=True)
    # Slurm's last word: job_state and state_reason.
    slurm_state = models.CharField(max_length=30, blank=True, default="")
    slurm_reason = models.CharField(max_length=200, blank=True, default="")
    # When the job last reported from its node (it does every few seconds while it runs): how far an
    # instance whose node died is charged.
    last_seen_running_at = models.DateTimeField(null=True, blank=True)
    # The highest gpu_busy_percent of the job's own GPUs in its last report, read on the node (None: the
    # node could not read it), for idle culling.
    gpu_busy_percent = models.PositiveSmallIntegerField(null=True, blank=True)
    submitted_at = models.DateTimeField(auto_now_add=True)
    ended_at = models.DateTimeField(null=True, blank=True)

    def __str__(self):
        return f"{self.name} (job {self.job_id})"


class Installation(models.Model):
    """This install's own id (one row, pk 1): labels its containers and volumes, names its Slurm jobs and
    keys its start slots, so two installs sharing an engine never touch each other's. Made at random by
    migration 0008 (or on first use), kept with the data; see provisioning/identity.py."""

    install_id = models.CharField(max_length=40, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self):
        return self.install_id
