import uuid

from django.conf import settings
from django.db import models
from django.db.models import Q

from .stop_reasons import STOP_NOTE_MAX, StopReason


class Image(models.Model):
    """A preloaded image from containers/catalog, loaded by `manage.py sync_images`."""

    key = models.SlugField(unique=True, help_text="Catalogue key, e.g. 'pytorch'.")
    name = models.CharField(max_length=100)
    description = models.TextField(blank=True)
    frameworks = models.JSONField(default=list, blank=True)
    # Sizes this image may run at, e.g. ["1x", "8x"].
    sizes = models.JSONField(default=list)
    # The Docker reference a host runs, e.g. "devcloud/cpu:3f2a9c1e0b7d".
    reference = models.CharField(max_length=200)
    # Path of the build context under containers/, e.g. "cpu".
    build_context = models.CharField(max_length=200, blank=True)
    is_default = models.BooleanField(default=False)
    is_enabled = models.BooleanField(default=True)
    # True for images that need a GPU (every ROCm image); the CPU image runs anywhere.
    needs_gpu = models.BooleanField(default=True)
    sort_order = models.PositiveIntegerField(default=100)

    class Meta:
        ordering = ["sort_order", "name"]

    def __str__(self):
        return self.name


class Instance(models.Model):
    """One launch of an image at a size, from queued to stopped or failed."""

    class State(models.TextChoices):
        QUEUED = "queued", "Queued"
        PROVISIONING = "provisioning", "Provisioning"
        RUNNING = "running", "Running"
        STOPPING = "stopping", "Stopping"
        STOPPED = "stopped", "Stopped"
        FAILED = "failed", "Failed"

    class Step(models.TextChoices):
        QUEUED = "queued", "Queued"
        ALLOCATING = "allocating", "Allocating GPUs"
        STARTING = "starting", "Starting container"
        WAITING = "waiting", "Waiting for JupyterLab"
        READY = "ready", "Ready"

    LIVE_STATES = (State.QUEUED, State.PROVISIONING, State.RUNNING, State.STOPPING)

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # No index of its own: the (user, state) index below starts with it.
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="instances", db_index=False
    )
    # The project whose pool pays for it; empty for a personal instance, paid by `user`.
    project = models.ForeignKey(
        "projects.Project", null=True, blank=True, on_delete=models.PROTECT, related_name="instances",
        db_index=False,
    )
    size = models.CharField(max_length=10)
    image = models.ForeignKey(Image, on_delete=models.PROTECT, related_name="instances")
    host = models.ForeignKey(
        "provisioning.GpuHost", null=True, blank=True, on_delete=models.PROTECT, related_name="instances"
    )
    # Indexed through (state, created_at) below.
    state = models.CharField(max_length=20, choices=State.choices, default=State.QUEUED)
    step = models.CharField(max_length=20, choices=Step.choices, default=Step.QUEUED)
    # What went wrong and what to do next, shown to the owner.
    failure_reason = models.TextField(blank=True, default="")
    # Why it stopped, blank until it does; selectors.stop_reason_text turns it into the owner's sentence.
    stop_reason = models.CharField(max_length=20, choices=StopReason.choices, blank=True, default="")
    # The operator's own words for an operator stop or an eviction, shown to the owner beside the reason.
    stop_note = models.CharField(max_length=STOP_NOTE_MAX, blank=True, default="")
    # Driver-owned JSON state (container id, endpoint, workspace volume...), see provisioning.drivers.
    driver = models.CharField(max_length=20, default="docker")
    driver_state = models.JSONField(default=dict, blank=True)
    # Secret token JupyterLab requires; sent by the gateway, never shown in a URL.
    jupyter_token = models.CharField(max_length=64, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    provisioning_at = models.DateTimeField(null=True, blank=True)
    ready_at = models.DateTimeField(null=True, blank=True)
    stopped_at = models.DateTimeField(null=True, blank=True)
    # A run's own time limit (`devcloud run --timeout`, the API's stop_after_seconds): the portal stops the
    # instance at this time, whatever became of the client that launched it. Null: only the size's limit.
    deadline_at = models.DateTimeField(null=True, blank=True)
    # The booking this instance runs on (portal/instances/reservations.py): placed on its host, paid from
    # the credit held for it, stopped at its window's end (deadline_at). Null: an ordinary launch.
    reservation = models.ForeignKey(
        "Reservation", null=True, blank=True, on_delete=models.PROTECT, related_name="instances"
    )
    # Hours the owner added to the session's longest length (services.instance_extend), in seconds.
    # Not to deadline_at: a run's own deadline is the client's and stays where it was set.
    extended_seconds = models.PositiveIntegerField(default=0)
    # Metering: charged up to this moment; the next tick charges from here.
    metered_until = models.DateTimeField(null=True, blank=True)
    charged_gpu_seconds = models.BigIntegerField(default=0)
    # GPU use as the idle culler sampled it (portal/instances/efficiency.py): GPU-seconds it had a reading
    # for, and of those the ones the GPUs were busy. Both 0 means never measured, not idle.
    gpu_seconds_sampled = models.BigIntegerField(default=0)
    gpu_seconds_busy = models.BigIntegerField(default=0)
    # When the culler last had a reading; the next one counts the time since (capped).
    gpu_sampled_at = models.DateTimeField(null=True, blank=True)
    # Updated on every state change, so the reconciler can spot instances stuck in a transition.
    state_changed_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["user", "state"]),
            models.Index(fields=["state", "created_at"]),
            models.Index(fields=["project", "state"], name="instances_project_state"),
            # The limits beat's scan for runs past their deadline reads only the few rows that have one.
            models.Index(fields=["deadline_at"], condition=Q(deadline_at__isnull=False), name="instance_deadline"),
        ]
        constraints = [
            models.CheckConstraint(condition=Q(size__in=["1x", "8x"]), name="instances_known_size"),
            models.CheckConstraint(
                condition=Q(stop_reason__in=["", *StopReason.values]), name="instances_known_stop_reason"
            ),
            models.CheckConstraint(
                condition=Q(gpu_seconds_busy__gte=0, gpu_seconds_busy__lte=models.F("gpu_seconds_sampled")),
                name="instances_gpu_busy_within_sampled",
            ),
        ]

    def __str__(self):
        return f"{self.short_id} {self.size} {self.image_id} ({self.state})"

    @property
    def short_id(self) -> str:
        return str(self.id)[:8]

    @property
    def is_live(self) -> bool:
        return self.state in self.LIVE_STATES


class InstanceEvent(models.Model):
    """The timeline of an instance: each state or step change with a message a person can read."""

    instance = models.ForeignKey(Instance, on_delete=models.CASCADE, related_name="events")
    state = models.CharField(max_length=20)
    step = models.CharField(max_length=20, blank=True, default="")
    message = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "id"]


# LaunchPolicy defaults that have no setting of their own. Hours and minutes per size; 0 means no limit.
DEFAULT_MAX_SESSION_HOURS = {"1x": 12, "8x": 4}
DEFAULT_IDLE_MINUTES = {"1x": 60, "8x": 30}
DEFAULT_IDLE_GRACE_MINUTES = 15


class LaunchPolicy(models.Model):
    """The operators' launch rules: which sizes each tier may launch, how many instances one person may
    have at once, how long a session may run and when an idle one is stopped, per size.

    There is one row, created from the settings on first read (LaunchPolicy.current()), so that a fresh
    install behaves as its settings say until an operator changes something in the console. Change it
    only through portal.instances.entitlements.launch_policy_update, which audits every change.
    """

    SINGLETON_PK = 1

    # Sizes any account with a verified email may launch, e.g. ["1x"].
    free_sizes = models.JSONField(default=list, blank=True)
    # Sizes that open once an operator approved one of the person's bonus applications, e.g. ["8x"].
    bonus_sizes = models.JSONField(default=list, blank=True)
    # Queued, provisioning and running instances one person may have at once.
    max_live_instances = models.PositiveIntegerField()
    # Per size key: hours from ready to the stop DevCloud makes (provisioning.limits); 0 or absent = none.
    max_session_hours = models.JSONField(default=dict, blank=True)
    # Per size key: idle minutes before the culler warns the owner; 0 or absent = never culled.
    idle_minutes = models.JSONField(default=dict, blank=True)
    # Minutes between the idle warning and the stop.
    idle_grace_minutes = models.PositiveIntegerField(default=DEFAULT_IDLE_GRACE_MINUTES)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = verbose_name_plural = "launch policy"
        constraints = [models.CheckConstraint(condition=Q(id=1), name="instances_launchpolicy_singleton")]

    def __str__(self):
        return "Launch policy"

    @classmethod
    def defaults(cls) -> dict:
        """The values a fresh install starts with: SIZES_REQUIRING_BONUS and MAX_LIVE_INSTANCES_PER_USER
        from the settings, and the DEFAULT_* constants above."""
        from .sizes import SIZES

        bonus = [key for key in getattr(settings, "SIZES_REQUIRING_BONUS", []) if key in SIZES]
        return {
            "free_sizes": [key for key in SIZES if key not in bonus],
            "bonus_sizes": bonus,
            "max_live_instances": getattr(settings, "MAX_LIVE_INSTANCES_PER_USER", 4),
            "max_session_hours": dict(DEFAULT_MAX_SESSION_HOURS),
            "idle_minutes": dict(DEFAULT_IDLE_MINUTES),
            "idle_grace_minutes": DEFAULT_IDLE_GRACE_MINUTES,
        }

    @classmethod
    def current(cls) -> "LaunchPolicy":
        """The policy in force, created from defaults() if no operator has saved one yet. Read it afresh
        where it matters (no process cache): an operator's change applies to the next launch."""
        policy, _ = cls.objects.get_or_create(pk=cls.SINGLETON_PK, defaults=cls.defaults())
        return policy

    def max_session_hours_for(self, size_key: str) -> int:
        """Hours an instance of this size may run from ready before it is stopped; 0 means no limit."""
        return int(self.max_session_hours.get(size_key) or 0)

    def idle_minutes_for(self, size_key: str) -> int:
        """Idle minutes after which an instance of this size is warned (then stopped after
        idle_grace_minutes); 0 means it is never culled."""
        return int(self.idle_minutes.get(size_key) or 0)


class Reservation(models.Model):
    """A booking of `gpus` GPUs of one host (8: the whole host) for the window [starts_at, ends_at).

    Booked, its credit is held (hold_gpu_seconds, less what its instances have been charged) from the
    paying account, the booker's own or the project's pool; the scheduler keeps its GPUs free as the window
    nears, and inside the window only the booker launches on them. When the window ends it is settled:
    the hold goes and the unused charge is posted. Write it only through portal/instances/reservations.py.
    """

    class State(models.TextChoices):
        BOOKED = "booked", "Booked"
        SETTLED = "settled", "Settled"
        CANCELLED = "cancelled", "Cancelled"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="reservations")
    # The project whose pool pays; empty for a booking paid by `user`.
    project = models.ForeignKey(
        "projects.Project", null=True, blank=True, on_delete=models.PROTECT, related_name="reservations"
    )
    host = models.ForeignKey("provisioning.GpuHost", on_delete=models.PROTECT, related_name="reservations")
    gpus = models.PositiveSmallIntegerField()
    starts_at = models.DateTimeField()
    ends_at = models.DateTimeField()
    state = models.CharField(max_length=20, choices=State.choices, default=State.BOOKED)
    # gpus x the window's seconds: checked against the payer's credit at booking and held until settled.
    hold_gpu_seconds = models.BigIntegerField()
    # At settlement: what its instances were charged (at most the hold), and the unused time's charge.
    used_gpu_seconds = models.BigIntegerField(default=0)
    unused_charge_gpu_seconds = models.BigIntegerField(default=0)
    # Who cancelled it and why (an operator's reason is told to the booker); blank while it stands.
    cancelled_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    cancel_reason = models.CharField(max_length=STOP_NOTE_MAX, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["starts_at", "id"]
        indexes = [
            # Placement and booking read a host's standing bookings by window.
            models.Index(fields=["host", "state", "starts_at"], name="reservation_host_window"),
            # The settling beat reads standing bookings by their end.
            models.Index(fields=["state", "ends_at"], name="reservation_state_end"),
        ]
        constraints = [
            models.CheckConstraint(condition=Q(gpus__gte=1, gpus__lte=8), name="reservation_gpus_1_to_8"),
            models.CheckConstraint(condition=Q(ends_at__gt=models.F("starts_at")), name="reservation_window"),
            models.CheckConstraint(
                condition=Q(state__in=["booked", "settled", "cancelled"]), name="reservation_state"
            ),
            models.CheckConstraint(
                condition=Q(hold_gpu_seconds__gte=0), name="reservation_hold_not_negative"
            ),
        ]

    def __str__(self):
        window = f"{self.starts_at:%Y-%m-%d %H:%M}-{self.ends_at:%H:%M}"
        return f"{self.short_id} {self.gpus} GPU(s) {window} ({self.state})"

    @property
    def short_id(self) -> str:
        return str(self.id)[:8]

    @property
    def whole_host(self) -> bool:
        return self.gpus == 8

    def is_open(self, now) -> bool:
        """Booked and inside its window at `now`."""
        return self.state == self.State.BOOKED and self.starts_at <= now < self.ends_at
