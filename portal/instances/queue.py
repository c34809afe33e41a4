"""The queue's order by fair share, and each waiting launch's place in it and why.

The rule (docs/architecture.md, "The queue: fair share and estimates"): a waiting launch's owner's GPU
use over the last FAIR_SHARE_WINDOW_HOURS (GPU-seconds of their instances from ready to stop, clipped to
the window, running ones up to now), divided by their share (User.queue_share, 1 unless an operator set
it), is its weighted use. Launches that have waited longer than FAIR_SHARE_MAX_WAIT_SECONDS come first,
oldest first; then the rest, least weighted use first, then oldest first. The fleet's scheduler takes
this order as it is handed down (scheduler.next_queued) and keeps 8x launches from starving in it.

rank() is pure, so the fair-share benchmark orders its simulated launches with it.
"""

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db.models import Q
from django.utils import timezone

from .models import Instance
from .sizes import SIZES

DEFAULT_SHARE = 1.0


def window() -> timedelta:
    """How far back a person's GPU use counts (FAIR_SHARE_WINDOW_HOURS)."""
    return timedelta(hours=settings.FAIR_SHARE_WINDOW_HOURS)


def max_wait() -> timedelta:
    """How long a launch waits before it goes ahead by age (FAIR_SHARE_MAX_WAIT_SECONDS)."""
    return timedelta(seconds=settings.FAIR_SHARE_MAX_WAIT_SECONDS)


@dataclass(frozen=True)
class Standing:
    """A waiting launch (an Instance, or anything with id, user_id, size and created_at) and what ranks it."""

    launch: object
    used_gpu_seconds: int
    share: float
    # Waited longer than max_wait(): it goes by age, ahead of every launch that has not.
    overdue: bool

    @property
    def weighted_use(self) -> float:
        return self.used_gpu_seconds / self.share

    def rank_key(self) -> tuple:
        if self.overdue:
            return (0, 0.0, self.launch.created_at, self.launch.id)
        return (1, self.weighted_use, self.launch.created_at, self.launch.id)


def gpu_seconds_in_window(
    *, gpus: int, ready_at: datetime, ended_at: datetime | None, since: datetime, now
) -> int:
    """GPU-seconds an instance of `gpus` GPUs ran between `since` and `now`: from ready_at to ended_at (now
    while it runs), clipped to that window."""
    start, end = max(ready_at, since), min(ended_at or now, now)
    return gpus * max(0, int((end - start).total_seconds()))


def rank(
    launches: Iterable, *, used: dict, shares: dict, now: datetime, max_wait: timedelta
) -> list[Standing]:
    """`launches` in fair-share order, each with its standing. `used` maps an owner's id to their
    GPU-seconds in the window (0 when absent), `shares` to their share (DEFAULT_SHARE when absent)."""
    standings = [
        Standing(
            launch=launch,
            used_gpu_seconds=used.get(launch.user_id, 0),
            share=shares.get(launch.user_id, DEFAULT_SHARE),
            overdue=now - launch.created_at > max_wait,
        )
        for launch in launches
    ]
    return sorted(standings, key=Standing.rank_key)


def used_gpu_seconds(user_ids: Iterable[int], *, now: datetime) -> dict[int, int]:
    """Each person's GPU-seconds over the window ending `now`, whoever paid (their own or a project's)."""
    since = now - window()
    rows = Instance.objects.filter(
        user_id__in=set(user_ids), ready_at__isnull=False, ready_at__lt=now
    ).filter(Q(stopped_at__isnull=True) | Q(stopped_at__gt=since))
    used: dict[int, int] = {}
    for user_id, size, ready_at, stopped_at in rows.values_list("user_id", "size", "ready_at", "stopped_at"):
        gpus = SIZES[size].gpus if size in SIZES else 0
        used[user_id] = used.get(user_id, 0) + gpu_seconds_in_window(
            gpus=gpus, ready_at=ready_at, ended_at=stopped_at, since=since, now=now
        )
    return used


def shares_of(user_ids: Iterable[int]) -> dict[int, float]:
    rows = get_user_model().objects.filter(id__in=set(user_ids)).values_list("id", "queue_share")
    return {user_id: float(share) for user_id, share in rows}


def standings(*, now: datetime | None = None, also: Instance | None = None) -> list[Standing]:
    """Every QUEUED launch (and `also`, whatever its state) in fair-share order."""
    now = now or timezone.now()
    launches = list(Instance.objects.filter(state=Instance.State.QUEUED))
    if also is not None and all(launch.id != also.id for launch in launches):
        launches.append(also)
    owners = {launch.user_id for launch in launches}
    return rank(
        launches,
        used=used_gpu_seconds(owners, now=now),
        shares=shares_of(owners),
        now=now,
        max_wait=max_wait(),
    )


def queue_order(*, now: datetime | None = None) -> list[Instance]:
    """The QUEUED instances in the order they are to get GPUs (before the scheduler's 8x rules)."""
    return [standing.launch for standing in standings(now=now)]


@dataclass(frozen=True)
class Place:
    """Where a queued launch stands: its 1-based position, its standing and those of the launches ahead."""

    position: int
    standing: Standing
    ahead: list[Standing]


def place_of(instance: Instance, *, now: datetime | None = None) -> Place | None:
    """The queued instance's place in the queue; None when it is not QUEUED."""
    if instance.state != Instance.State.QUEUED:
        return None
    ranked = standings(now=now)
    for index, standing in enumerate(ranked):
        if standing.launch.id == instance.id:
            return Place(position=index + 1, standing=standing, ahead=ranked[:index])
    return None  # it left the queue since the caller read it


def ordinal(number: int) -> str:
    """1st, 2nd, 3rd, 4th, 11th, 21st."""
    suffix = "th" if 10 <= number % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(number % 10, "th")
    return f"{number}{suffix}"


def span_text(seconds: float) -> str:
    """A length for people: '7 days', '36 h', '2 h', '90 min'."""
    seconds = int(seconds)
    if seconds >= 2 * 86400 and seconds % 86400 == 0:
        return f"{seconds // 86400} days"
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{seconds // 3600} h"
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{max(seconds // 60, 1)} min"


def _count(number: int, one: str, many: str) -> str:
    return f"{number} {one if number == 1 else many}"


def why_text(place: Place) -> str:
    """Why the launch is where it is, for its owner: their use and share, and why each launch ahead is."""
    standing = place.standing
    hours = standing.used_gpu_seconds / 3600
    own = (
        f"you used {hours:.1f} GPU-hours in the last {span_text(window().total_seconds())} "
        f"with share {standing.share:g}"
    )
    bound = span_text(max_wait().total_seconds())
    if standing.overdue:
        own = f"it has waited longer than {bound}, so it goes by age ({own})"
    if not place.ahead:
        return f"1st in line: {own}. It starts as soon as GPUs it fits on free up."
    waited = sum(1 for other in place.ahead if other.overdue)
    used_less = sum(
        1 for other in place.ahead if not other.overdue and other.weighted_use < standing.weighted_use
    )
    earlier = len(place.ahead) - waited - used_less
    reasons = []
    if waited:
        reasons.append(f"{waited} waited longer than {bound}")
    if used_less:
        reasons.append(f"{used_less} from people who used less for their share")
    if earlier:
        reasons.append(f"{earlier} queued earlier by people who used as much for their share")
    ahead = _count(len(place.ahead), "launch is", "launches are")
    return f"{ordinal(place.position)} in line: {own}. {ahead} ahead: " + "; ".join(reasons) + "."
