"""Reads for instance pages: the launch options a user has, their instances, and an instance's progress."""

import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import F, IntegerField, OuterRef, Q, Subquery, Sum, Value
from django.db.models.functions import Coalesce, Greatest
from django.http import Http404
from django.utils import timezone

from portal.credits.models import GPU_SECONDS_PER_HOUR, CreditAccount, hours
from portal.gateway import open_path
from portal.projects.models import Project
from provisioning.selectors import (
    HostsInService,
    hosts_in_service_summary,
    image_availability,
    simulated_hosts_in_service,
)
from provisioning.shares import SizeResources, size_resources

from . import entitlements, estimates, queue, sessions
from .models import Image, Instance, LaunchPolicy, Reservation
from .sizes import SIZES, Size
from .stop_reasons import StopReason

# States that will burn credit: queued and provisioning instances are about to, running ones do.
BURNING_STATES = (Instance.State.QUEUED, Instance.State.PROVISIONING, Instance.State.RUNNING)
# The progress a person watches, in order; failed and stopped are shown beside it, not as steps.
PROGRESS_STEPS = [
    Instance.Step.QUEUED,
    Instance.Step.ALLOCATING,
    Instance.Step.STARTING,
    Instance.Step.WAITING,
    Instance.Step.READY,
]
# The owner's sentence for each stop reason. An operator's own words (stop_note) follow where there are some.
STOP_REASON_TEXT = {
    StopReason.USER: "You stopped it.",
    StopReason.CREDITS_EXHAUSTED: "DevCloud stopped it because your credits ran out. Add credits (apply for "
    "bonus hours) to launch again.",
    StopReason.OPERATOR: "An operator stopped it.",
    StopReason.IDLE: "It was stopped because it was idle.",
    StopReason.MAX_LENGTH: "It reached the longest a session may run at its size and was stopped. Your files "
    "in /workspace are kept; launch again to go on.",
    StopReason.DEADLINE: "It reached the time limit its launch set (devcloud run --timeout) and was stopped. "
    "Your files in /workspace are kept.",
    StopReason.SUSPENDED: "It was stopped because your account was suspended.",
    StopReason.HOST_EVICTED: "An operator took its GPU host out of service and stopped it. Your files in "
    "/workspace are kept; launch again to continue on another host.",
    StopReason.HOST_DOWN: "Its GPU host stopped answering, so DevCloud stopped it. You were charged only up "
    "to the last moment the host was seen working; launch again to continue on another host.",
    StopReason.ACCOUNT_DELETED: "It was stopped because the account was deleted.",
    StopReason.PROJECT_OWNER: "An owner of its project stopped it.",
    StopReason.REMOVED_FROM_PROJECT: "It was stopped because you were removed from its project.",
}


def launch_window_seconds() -> int:
    """The credit a launch must cover, in wall-clock seconds (LAUNCH_MIN_CREDIT_MINUTES)."""
    return settings.LAUNCH_MIN_CREDIT_MINUTES * 60


def launch_minimum_gpu_seconds(size: Size) -> int:
    return size.gpus * launch_window_seconds()


def _burn_of(rows, now: datetime) -> tuple[int, int]:
    """(GPUs, GPU-seconds burned but not yet charged) of (size, state, metered_until) rows."""
    gpus_total, unbilled = 0, 0
    for size_key, state, metered_until in rows:
        gpus = SIZES[size_key].gpus
        gpus_total += gpus
        if state == Instance.State.RUNNING and metered_until is not None and now > metered_until:
            unbilled += gpus * int((now - metered_until).total_seconds())
    return gpus_total, unbilled


def _burning(user, now: datetime, *, instances: list[Instance] | None = None) -> tuple[int, int, int]:
    """(GPUs of the user's personal queued, provisioning and running instances, GPU-seconds they burned
    but were not yet charged, how many such instances the user has, project ones included: the launch
    policy's per-person limit counts both). `instances`, when the caller has every live one of the
    user's, saves reading them."""
    if instances is not None:
        rows = [(i.size, i.state, i.metered_until, i.project_id) for i in instances if i.state in BURNING_STATES]
    else:
        rows = list(
            Instance.objects.filter(user=user, state__in=BURNING_STATES).values_list(
                "size", "state", "metered_until", "project_id"
            )
        )
    gpus_total, unbilled = _burn_of([row[:3] for row in rows if row[3] is None], now)
    return gpus_total, unbilled, len(rows)


def committed_gpu_seconds(user, *, now: datetime | None = None) -> int:
    """Credit the user's live personal instances will use within the launch window, in GPU-seconds
    (project instances are paid by their project's pool: project_committed_gpu_seconds).

    Each queued, provisioning or running instance counts its GPUs × the window, and a running one also
    counts what it has burned since its last charge (metered_until to now), which the balance does not
    show yet.
    """
    gpus, unbilled, _ = _burning(user, now or timezone.now())
    return gpus * launch_window_seconds() + unbilled + held_gpu_seconds(user=user)


def held_gpu_seconds(*, user=None, project_id=None) -> int:
    """Credit held for standing bookings, in GPU-seconds: for each booked Reservation paid by the user's
    own account (or, with `project_id`, by that project's pool), its hold less what its instances have
    been charged so far, never below 0. The balance still counts it; what may be spent is the balance
    less this (and less what live instances will burn)."""
    if project_id is not None:
        payer = Q(project_id=project_id)
    else:
        payer = Q(user=user, project__isnull=True)
    return _held(payer).aggregate(total=Sum("left"))["total"] or 0


def _held(payer: Q):
    """The standing bookings matching `payer`, each annotated with `left`: its hold less what its
    instances were charged, never below 0."""
    used = (
        Instance.objects.filter(reservation=OuterRef("pk"))
        .order_by()
        .values("reservation")
        .annotate(total=Sum("charged_gpu_seconds"))
        .values("total")
    )
    return (
        Reservation.objects.filter(payer, state=Reservation.State.BOOKED)
        .annotate(used=Coalesce(Subquery(used, output_field=IntegerField()), Value(0)))
        .annotate(left=Greatest(F("hold_gpu_seconds") - F("used"), Value(0)))
    )


def _held_of_user_subquery():
    """held_gpu_seconds of the personal account an outer CreditAccount query is on, as a subquery."""
    total = (
        _held(Q(user=OuterRef("user"), project__isnull=True))
        .order_by()
        .values("user")
        .annotate(total=Sum("left"))
        .values("total")
    )
    return Coalesce(Subquery(total, output_field=IntegerField()), Value(0))


def project_burning(project_id, *, now: datetime | None = None, user=None) -> tuple[int, int, int]:
    """(GPUs, GPU-seconds burned but not yet charged, count) of the project's queued, provisioning and
    running instances; only those `user` launched when given."""
    live = Instance.objects.filter(project_id=project_id, state__in=BURNING_STATES)
    if user is not None:
        live = live.filter(user=user)
    rows = list(live.values_list("size", "state", "metered_until"))
    gpus, unbilled = _burn_of(rows, now or timezone.now())
    return gpus, unbilled, len(rows)


def project_committed_gpu_seconds(project_id, *, now: datetime | None = None, user=None) -> int:
    """What the project's live instances (those `user` launched, when given) will use from its pool
    within the launch window, in GPU-seconds: committed_gpu_seconds' rule for the project's pool."""
    gpus, unbilled, _ = project_burning(project_id, now=now, user=user)
    held = held_gpu_seconds(project_id=project_id) if user is None else 0
    return gpus * launch_window_seconds() + unbilled + held


def running_gpus_of(user) -> int:
    """GPUs of the user's queued, provisioning and running instances."""
    return _burning(user, timezone.now())[0]


def duration_text(seconds: int) -> str:
    """e.g. '25 h 00 min', '12 min', 'less than a minute'."""
    minutes = max(seconds, 0) // 60
    if minutes < 1:
        return "less than a minute"
    if minutes < 60:
        return f"{minutes} min"
    return f"{minutes // 60} h {minutes % 60:02d} min"


@dataclass(frozen=True)
class SizeOption:
    """A size as the launch form offers it to one user."""

    size: Size
    # GPU-seconds the user may spend on a new launch: balance minus what other live instances will burn.
    available_gpu_seconds: int
    # GPUs the user's other live instances burn alongside.
    other_gpus: int
    # The balance minus what running instances burned since their last charge.
    runway_gpu_seconds: int = 0
    allowed_message: str = ""
    # Why the operators' launch policy keeps this size closed to the user, with where to open it.
    policy_refusal: entitlements.Refusal | None = None
    # How long an instance of this size may run, and when an idle one is stopped ('' if no limit).
    session_limit: str = ""
    # What it gets of its host (provisioning.shares.SizeResources); None when no host in service takes it.
    resources: SizeResources | None = None

    @property
    def key(self) -> str:
        return self.size.key

    @property
    def gpu_hours_per_hour(self) -> int:
        return self.size.gpu_hours_per_hour

    @property
    def needed_gpu_seconds(self) -> int:
        return launch_minimum_gpu_seconds(self.size)

    @property
    def shortfall_gpu_seconds(self) -> int:
        return max(self.needed_gpu_seconds - self.available_gpu_seconds, 0)

    @property
    def lasts_seconds(self) -> int:
        """How long the balance lasts at this size, running next to the user's other live instances."""
        return max(self.runway_gpu_seconds, 0) // (self.size.gpus + self.other_gpus)

    @property
    def lasts(self) -> str:
        return duration_text(self.lasts_seconds)

    @property
    def can_launch(self) -> bool:
        return not self.allowed_message and self.shortfall_gpu_seconds == 0

    @property
    def refusal(self) -> str:
        """Why this size cannot be launched now, in words a person can act on; '' when it can."""
        return self.allowed_message or self.shortfall

    @property
    def shortfall(self) -> str:
        """Why the balance does not cover a launch at this size; '' when it does."""
        if not self.shortfall_gpu_seconds:
            return ""
        return shortfall_message(
            self.size, self.needed_gpu_seconds, self.available_gpu_seconds, self.other_gpus
        )


def shortfall_message(size: Size, needed: int, available: int, other_gpus: int) -> str:
    minutes = settings.LAUNCH_MIN_CREDIT_MINUTES
    after = " after what your other instances will use in that time" if other_gpus else ""
    return (
        f"A {size.name} launch needs at least {hours(needed)} GPU-hours ({minutes} minutes at "
        f"{size.gpu_hours_per_hour} GPU-hour{'s' if size.gpu_hours_per_hour != 1 else ''} per hour); you have "
        f"{hours(max(available, 0))}{after}. You are {hours(needed - max(available, 0))} GPU-hours short."
    )


@dataclass(frozen=True)
class LaunchOptions:
    balance_gpu_seconds: int
    committed_gpu_seconds: int
    sizes: list[SizeOption]
    images: list[Image]
    verified: bool
    live_count: int
    live_limit: int
    # The suspended account's notice ('' when not suspended): nothing can be launched then.
    suspension: str = ""
    # A host in service has simulated GPUs (`make run` on a machine without AMD GPUs).
    simulated: bool = False
    # No GPU host is in service: a launch would wait in the queue until an operator adds one.
    no_host: bool = False
    # Credit held for the user's standing bookings (held_gpu_seconds), counted in committed_gpu_seconds.
    held_gpu_seconds: int = 0

    @property
    def held_hours(self) -> str:
        return hours(self.held_gpu_seconds)

    @property
    def preparing(self) -> list[Image]:
        """Images being built or pulled onto a host in service right now."""
        return [image for image in self.images if image.availability.state == "preparing"]

    @property
    def launchable_images(self) -> list[Image]:
        return [image for image in self.images if image.availability.launchable]

    @property
    def balance_hours(self) -> str:
        return hours(self.balance_gpu_seconds)

    @property
    def min_minutes(self) -> int:
        return settings.LAUNCH_MIN_CREDIT_MINUTES

    @property
    def can_launch(self) -> bool:
        return (
            not self.suspension
            and self.verified
            and self.live_count < self.live_limit
            and any(o.can_launch for o in self.sizes)
            and bool(self.launchable_images)
        )

    @property
    def refusal(self) -> str:
        """Why the Launch button is disabled; '' when it is not."""
        if self.suspension:
            return self.suspension
        if not self.verified:
            return "Confirm your email address to launch instances."
        if self.live_count >= self.live_limit:
            return entitlements.live_limit_refusal(self.live_count, self.live_limit).message
        if not any(o.can_launch for o in self.sizes):
            cheapest = min(self.sizes, key=lambda option: option.needed_gpu_seconds)
            return cheapest.refusal
        if not self.launchable_images:
            if self.preparing:
                return image_preparing_message(self.preparing[0])
            return "No image can start on a GPU host right now. The operators have been told."
        return ""


def image_preparing_message(image: Image) -> str:
    """What the launch page says while `image` is being built or pulled onto a host."""
    availability = image.availability
    how_far = f" ({availability.percent}% done)" if availability.percent is not None else ""
    return (
        f"The {image.name} image is being prepared on {availability.host_name}{how_far}. This page updates "
        "itself; you can launch it as soon as it is ready."
    )


def images_with_availability() -> list[Image]:
    """Enabled images, each with `availability` (provisioning.selectors.ImageAvailability) set."""
    images = launchable_images()
    availability = image_availability(image.reference for image in images)
    for image in images:
        image.availability = availability[image.reference]
    return images


def launchable_images():
    return list(Image.objects.filter(is_enabled=True))


@dataclass(frozen=True)
class Catalogue:
    """The half of the launch form that is the same for everybody: the policy in force, the enabled images
    and where they can start, whether any host is in service (and simulated), the open bonus programs."""

    policy: LaunchPolicy
    images: list[Image]
    hosts: HostsInService
    open_programs: list[str]
    # What an instance of each GPU count gets of its host (provisioning.shares.size_resources).
    size_resources: dict = field(default_factory=dict)


# The catalogue as this process last read it, and until when (time.monotonic()) it may be shown again.
_catalogue_cache: tuple[float, Catalogue] | None = None


def launch_catalogue() -> Catalogue:
    """The launch form's shared half, read at most once every LAUNCH_CATALOGUE_CACHE_SECONDS per web
    process. A busy instance list then costs the database the person's own rows only. What it shows may be
    that many seconds old; a launch itself always reads the policy, the images and the hosts afresh
    (services.instance_launch), and this process forgets its copy as soon as it changes one of them."""
    global _catalogue_cache
    ttl = settings.LAUNCH_CATALOGUE_CACHE_SECONDS
    cached = _catalogue_cache
    if ttl > 0 and cached is not None and cached[0] > time.monotonic():
        return cached[1]
    catalogue = Catalogue(
        policy=LaunchPolicy.current(),
        images=images_with_availability(),
        hosts=hosts_in_service_summary(),
        open_programs=entitlements.open_program_names(),
        size_resources=size_resources({size.gpus for size in SIZES.values()}),
    )
    if ttl > 0:
        _catalogue_cache = (time.monotonic() + ttl, catalogue)
    return catalogue


def forget_launch_catalogue(**_signal_arguments) -> None:
    """Drops this process's copy of the catalogue (connected to saves of what it is made of)."""
    global _catalogue_cache
    _catalogue_cache = None


def launch_options(
    user, *, now: datetime | None = None, instances: list[Instance] | None = None
) -> LaunchOptions:
    """What the launch form offers `user`: each size's price, how long the balance lasts, and any shortfall.

    `instances`, the user's instances as instances_of() lists them (every live one), saves reading the
    live ones again."""
    # The hold comes with the account, in the same query (the list page's reads are counted).
    account = CreditAccount.objects.filter(user=user).annotate(held=_held_of_user_subquery()).first()
    balance = account.balance_gpu_seconds if account else 0
    other_gpus, unbilled, live_count = _burning(user, now or timezone.now(), instances=instances)
    held = account.held if account else 0
    committed = other_gpus * launch_window_seconds() + unbilled + held
    catalogue = launch_catalogue()
    policy, hosts = catalogue.policy, catalogue.hosts
    applications = entitlements.standing_applications(user)
    tier = entitlements.tier_of(user, applications=applications)
    options = []
    for size in SIZES.values():
        policy_refusal = entitlements.size_refusal(
            user, size, policy, tier=tier, open_programs=catalogue.open_programs, applications=applications
        )
        options.append(
            SizeOption(
                size=size,
                available_gpu_seconds=balance - committed,
                other_gpus=other_gpus,
                runway_gpu_seconds=balance - unbilled,
                allowed_message=policy_refusal.message if policy_refusal else "",
                policy_refusal=policy_refusal,
                session_limit=entitlements.session_limit_text(size, policy),
                resources=catalogue.size_resources.get(size.gpus),
            )
        )
    return LaunchOptions(
        balance_gpu_seconds=balance,
        committed_gpu_seconds=committed,
        held_gpu_seconds=held,
        sizes=options,
        images=catalogue.images,
        verified=user.email_verified,
        live_count=live_count,
        live_limit=policy.max_live_instances,
        suspension=user.suspension_notice,
        simulated=hosts.simulated,
        no_host=not hosts.any,
    )


def instance_of_owner(user, instance_id) -> Instance:
    """The user's own instance. Raises Http404 for an unknown id and for someone else's instance alike,
    so a guessed id tells nobody whether it exists."""
    instance = (
        Instance.objects.select_related("image", "host").filter(id=instance_id, user=user).first()
        if getattr(user, "is_authenticated", False)
        else None
    )
    if instance is None:
        raise Http404("No such instance.")
    return instance


@dataclass(frozen=True)
class SessionStatus:
    # When the session's time limit stops it (extensions included); None when nothing does.
    ends_at: datetime | None
    time_left: str
    # Within SESSION_END_WARNING_MINUTES of the end: the page says so.
    ending_soon: bool
    # Hours the owner may still add (SESSION_MAX_EXTENSION_HOURS less what was added); 0: no Extend form.
    extendable_hours: int


def session_status(instance: Instance, *, now: datetime | None = None) -> SessionStatus:
    """The instance page's session line: its end, the time left, and how many hours may still be added."""
    now = now or timezone.now()
    ends_at = sessions.session_end(instance, LaunchPolicy.current())
    extendable = max(settings.SESSION_MAX_EXTENSION_HOURS - instance.extended_seconds // 3600, 0)
    if ends_at is None:
        # The page keeps the (hidden) Extend form, for when the instance it polls turns ready.
        return SessionStatus(None, "", False, extendable)
    left = max(int((ends_at - now).total_seconds()), 0)
    warning = timedelta(minutes=settings.SESSION_END_WARNING_MINUTES)
    return SessionStatus(ends_at, duration_text(left), ends_at - now <= warning, extendable)


def launch_projects_of(user) -> list:
    """The projects `user` may launch for (the launch form's "Pay from"), by name, each with its pool's
    balance as `balance_hours`."""
    projects = list(
        Project.objects.filter(memberships__user=user)
        .select_related("credit_account")
        .order_by("name")
    )
    for project in projects:
        account = getattr(project, "credit_account", None)
        project.balance_hours = hours(account.balance_gpu_seconds if account else 0)
    return projects


def instance_stoppable_by(user, instance_id) -> Instance:
    """An instance `user` may stop: their own, or one of a project they own. Raises Http404 for an
    unknown id and for anyone else's instance alike."""
    if not getattr(user, "is_authenticated", False):
        raise Http404("No such instance.")
    instance = (
        Instance.objects.select_related("image", "host", "project")
        .filter(
            Q(user=user)
            | Q(project__memberships__user=user, project__memberships__role="owner"),
            id=instance_id,
        )
        .first()
    )
    if instance is None:
        raise Http404("No such instance.")
    return instance


def instances_of(user, *, ended_limit: int = 20) -> list[Instance]:
    """The user's live instances (newest first), then their latest `ended_limit` stopped or failed ones."""
    base = Instance.objects.filter(user=user).select_related("image", "project").order_by("-created_at")
    live = list(base.filter(state__in=Instance.LIVE_STATES))
    ended = list(base.exclude(state__in=Instance.LIVE_STATES)[:ended_limit])
    for instance in live + ended:
        # For the instance card, which cannot call functions with arguments.
        instance.queue_position = queue_position(instance)
        instance.stop_reason_text = stop_reason_text(instance)
        instance.lab_url = lab_url(instance)
    return live + ended


def credits_exhausted_notice(user, *, instances: list[Instance] | None = None) -> Instance | None:
    """The instance to tell the user about when their latest instance was stopped because credits ran out.

    None when their most recent instance ended for another reason, or is still live. `instances`, the
    user's instances as instances_of() lists them, saves reading the latest one again.
    """
    if instances is not None:
        latest = max(instances, key=lambda instance: instance.created_at, default=None)
    else:
        latest = Instance.objects.filter(user=user).order_by("-created_at").first()
    if latest is not None and latest.stop_reason == StopReason.CREDITS_EXHAUSTED:
        return latest
    return None


def queue_position(instance: Instance) -> int | None:
    """1-based place of a queued instance in the queue's fair-share order; None if not queued."""
    place = queue.place_of(instance)
    return place.position if place else None


@dataclass(frozen=True)
class QueueStatus:
    """A queued launch's place in line, why it is there, and when it will likely start, for its owner."""

    position: int
    reason: str
    estimated_start_at: datetime | None
    estimate_basis: str


def queue_status(instance: Instance, *, now: datetime | None = None) -> QueueStatus | None:
    """The queued instance's place, the reason for it and its estimated start; None if not queued."""
    now = now or timezone.now()
    place = queue.place_of(instance, now=now)
    if place is None:
        return None
    estimate = estimates.estimate(instance, now=now, place=place)
    return QueueStatus(
        position=place.position,
        reason=queue.why_text(place),
        estimated_start_at=estimate.starts_at,
        estimate_basis=estimate.basis,
    )


def runs_on_simulated_gpus(instance: Instance) -> bool:
    """True when the instance's host has simulated GPUs, or, before it has a host, when a host in service
    does (where it will most likely land)."""
    if instance.host_id is not None:
        return instance.host.is_simulated
    return simulated_hosts_in_service()


def lab_url(instance: Instance) -> str:
    """Where the owner opens JupyterLab: the gateway's /open route, which works in path and subdomain
    mode. Never carries the token."""
    return open_path(instance.id)


def stop_reason_text(instance: Instance) -> str:
    """The sentence the owner reads about why their instance stopped; "" while it has not."""
    reason, note = instance.stop_reason, instance.stop_note
    if reason == StopReason.OPERATOR and note:
        return f"An operator stopped it: {note}"
    if reason == StopReason.CREDITS_EXHAUSTED and instance.project_id:
        return "DevCloud stopped it because its project's pool of GPU-hours ran out."
    text = STOP_REASON_TEXT.get(reason, "")
    if reason == StopReason.HOST_EVICTED and note:
        return f"{text} The operator's reason: {note}"
    return text


def progress(instance: Instance) -> list[dict]:
    """The progress steps with 'done', 'current' or 'todo' for each."""
    current = PROGRESS_STEPS.index(instance.step) if instance.step in PROGRESS_STEPS else 0
    finished = instance.state in (Instance.State.RUNNING,) or instance.ready_at is not None
    steps = []
    for index, step in enumerate(PROGRESS_STEPS):
        if finished or index < current:
            status = "done"
        elif index == current and instance.state in (Instance.State.QUEUED, Instance.State.PROVISIONING):
            status = "current"
        elif index == current and instance.state == Instance.State.FAILED:
            status = "failed"
        else:
            status = "todo"
        steps.append({"step": step.value, "label": step.label, "status": status})
    return steps


def _queue_fields(instance: Instance) -> dict:
    status = queue_status(instance)
    if status is None:
        return {"queue_position": None, "queue_reason": "", "estimated_start_at": None, "estimate_basis": ""}
    starts_at = status.estimated_start_at
    return {
        "queue_position": status.position,
        "queue_reason": status.reason,
        "estimated_start_at": starts_at.isoformat() if starts_at else None,
        "estimate_basis": status.estimate_basis,
    }


def _session_fields(instance: Instance) -> dict:
    # The page's time-left line, kept current by its polling; ends_at None hides it.
    session = session_status(instance)
    return {
        "ends_at": session.ends_at.isoformat() if session.ends_at else None,
        "ends_at_text": session.ends_at.strftime("%Y-%m-%d %H:%M") if session.ends_at else "",
        "time_left": session.time_left,
        "ending_soon": session.ending_soon,
    }


def instance_status(instance: Instance) -> dict:
    """The JSON the instance page polls: state, step, progress, reasons, and where to open JupyterLab."""
    running = instance.state == Instance.State.RUNNING
    charged = instance.charged_gpu_seconds
    return {
        "id": str(instance.id),
        "state": instance.state,
        "state_label": instance.get_state_display(),
        "step": instance.step,
        "step_label": instance.get_step_display(),
        "steps": progress(instance),
        **_queue_fields(instance),
        "failure_reason": instance.failure_reason,
        "stop_reason": stop_reason_text(instance),
        "lab_url": lab_url(instance) if running else "",
        "can_stop": instance.state
        in (Instance.State.QUEUED, Instance.State.PROVISIONING, Instance.State.RUNNING),
        "is_final": instance.state in (Instance.State.STOPPED, Instance.State.FAILED),
        "charged_gpu_hours": f"{charged / GPU_SECONDS_PER_HOUR:.2f}",
        "session": _session_fields(instance),
        "events": [
            {
                "at": event.created_at.isoformat(),
                "state": event.state,
                "step": event.step,
                "message": event.message,
            }
            for event in instance.events.all()
        ],
    }
