import uuid

from django.conf import settings
from django.db import models
from django.db.models import Q


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
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="instances")
    size = models.CharField(max_length=10)
    image = models.ForeignKey(Image, on_delete=models.PROTECT, related_name="instances")
    host = models.ForeignKey(
        "provisioning.GpuHost", null=True, blank=True, on_delete=models.PROTECT, related_name="instances"
    )
    state = models.CharField(max_length=20, choices=State.choices, default=State.QUEUED, db_index=True)
    step = models.CharField(max_length=20, choices=Step.choices, default=Step.QUEUED)
    # What went wrong and what to do next, shown to the owner.
    failure_reason = models.TextField(blank=True, default="")
    # Why it stopped (user, credits exhausted, operator, idle, max length), shown to the owner.
    stop_reason = models.CharField(max_length=200, blank=True, default="")
    # Driver-owned JSON state (container id, endpoint, workspace volume...), see provisioning.drivers.
    driver = models.CharField(max_length=20, default="docker")
    driver_state = models.JSONField(default=dict, blank=True)
    # Secret token JupyterLab requires; sent by the gateway, never shown in a URL.
    jupyter_token = models.CharField(max_length=64, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    provisioning_at = models.DateTimeField(null=True, blank=True)
    ready_at = models.DateTimeField(null=True, blank=True)
    stopped_at = models.DateTimeField(null=True, blank=True)
    # Metering: charged up to this moment; the next tick charges from here.
    metered_until = models.DateTimeField(null=True, blank=True)
    charged_gpu_seconds = models.BigIntegerField(default=0)
    # Updated on every state change, so the reconciler can spot instances stuck in a transition.
    state_changed_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["user", "state"]), models.Index(fields=["state", "created_at"])]
        constraints = [models.CheckConstraint(condition=Q(size__in=["1x", "8x"]), name="instances_known_size")]

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
