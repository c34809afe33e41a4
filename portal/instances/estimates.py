"""When a queued launch will likely start, and on what basis, in words its owner reads.

The estimate (docs/architecture.md, "The queue: fair share and estimates") replays the queue against the
latest end of every instance holding GPUs on an active host: each ends at the latest at its session's
end (sessions.stops_at: its longest length or the deadline its launch set) or when its payer's credit
runs out at the rate their running instances burn it, whichever comes first. The launches ahead of it
(queue.place_of) take GPUs as those ends free them, in order, each holding them for its own longest
session; the launch starts when a host it fits on is free. The history of the window (the median wait of
recent launches of its size that had to wait) backs it up when the ends cannot tell.
"""

import heapq
import statistics
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import Count, Min
from django.utils import timezone

from portal.credits.models import CreditAccount
from provisioning.models import Gpu, GpuAllocation, GpuHost

from . import queue, sessions
from .models import Instance, LaunchPolicy
from .sizes import SIZES

GPUS_PER_WHOLE_HOST = 8
# A launch counts as having waited (for the median) when its GPUs came later than this after its launch.
WAITED_AFTER = timedelta(minutes=1)
# The most recent waits the median reads.
HISTORY_LAUNCHES = 500
ENDS_BECAUSE = {
    "max_length": "at its maximum length",
    "deadline": "at the deadline its launch set",
    "credits": "when its owner's credit runs out",
    "queued": "at its maximum length",
}


@dataclass(frozen=True)
class Estimate:
    """When a queued launch is expected to start (None: no estimate) and why, in words."""

    starts_at: datetime | None
    basis: str


@dataclass(frozen=True)
class _End:
    at: datetime
    host_id: int
    gpus: int
    # What frees the GPUs, for the basis: "the 8x on gpu-03".
    what: str
    because: str


def _credit_runs_out(holders: list[Instance], now: datetime) -> dict:
    """When each running holder's payer runs out of credit at the rate its running instances burn it."""
    payer = {
        i.id: ("project", i.project_id) if i.project_id else ("user", i.user_id)
        for i in holders
        if i.state == Instance.State.RUNNING
    }
    burn: dict = {}
    unbilled: dict = {}
    for instance in holders:
        if instance.id not in payer:
            continue
        key, gpus = payer[instance.id], SIZES[instance.size].gpus
        burn[key] = burn.get(key, 0) + gpus
        since = instance.metered_until or instance.ready_at or now
        unbilled[key] = unbilled.get(key, 0) + gpus * max(0, int((now - since).total_seconds()))
    user_ids = [owner for kind, owner in burn if kind == "user"]
    project_ids = [owner for kind, owner in burn if kind == "project"]
    balances = {}
    for account in CreditAccount.objects.filter(user_id__in=user_ids):
        balances[("user", account.user_id)] = account.balance_gpu_seconds
    for account in CreditAccount.objects.filter(project_id__in=project_ids):
        balances[("project", account.project_id)] = account.balance_gpu_seconds
    runs_out = {}
    for instance_id, key in payer.items():
        left = max(0, balances.get(key, 0) - unbilled[key])
        runs_out[instance_id] = now + timedelta(seconds=left // burn[key])
    return runs_out


def _latest_end(instance: Instance, policy: LaunchPolicy, runs_out: dict, now: datetime):
    """(when, why) the instance stops at the latest; (None, "") when nothing will stop it."""
    ends = []
    if instance.state == Instance.State.RUNNING:
        session = sessions.session_end(instance, policy)
    else:
        # Still starting: its session begins about now.
        limit = sessions.session_limit(instance, policy)
        session = now + timedelta(seconds=limit.seconds + instance.extended_seconds) if limit else None
    if session is not None:
        ends.append((session, "max_length"))
    if instance.deadline_at is not None:
        ends.append((instance.deadline_at, "deadline"))
    if instance.id in runs_out:
        ends.append((runs_out[instance.id], "credits"))
    return min(ends, key=lambda end: end[0]) if ends else (None, "")


def _fleet(now: datetime, policy: LaunchPolicy):
    """(present GPUs per active host, free GPUs per host, the holders' latest ends as a heap); a holder that
    nothing stops frees nothing."""
    present = dict(
        Gpu.objects.filter(host__state=GpuHost.State.ACTIVE, is_present=True, is_drained=False)
        .values("host_id")
        .annotate(count=Count("id"))
        .values_list("host_id", "count")
    )
    names = dict(GpuHost.objects.filter(id__in=present).values_list("id", "name"))
    live = GpuAllocation.objects.filter(released_at__isnull=True, gpu__host_id__in=present)
    held: dict = {}
    for instance_id, host_id in live.values_list("instance_id", "gpu__host_id"):
        held.setdefault(instance_id, [host_id, 0])[1] += 1
    holders = list(Instance.objects.filter(id__in=held).select_related("project"))
    runs_out = _credit_runs_out(holders, now)
    free = dict(present)
    ends = []
    for instance in holders:
        host_id, gpus = held[instance.id]
        free[host_id] -= gpus
        at, because = _latest_end(instance, policy, runs_out, now)
        if at is None:
            continue
        what = f"the {instance.size} on {names[host_id]}"
        ends.append((max(at, now), str(instance.id), _End(max(at, now), host_id, gpus, what, because)))
    heapq.heapify(ends)
    return present, free, ends


def _host_for(gpus: int, present: dict, free: dict):
    """The host a launch of `gpus` GPUs takes now, as placement packs (fullest first); None if none fits."""
    if gpus == GPUS_PER_WHOLE_HOST:
        whole = [h for h in present if present[h] == GPUS_PER_WHOLE_HOST and free[h] == GPUS_PER_WHOLE_HOST]
        return min(whole, default=None)
    fits = [h for h in present if free[h] >= gpus]
    return min(fits, key=lambda h: (-(present[h] - free[h]), free[h], h), default=None)


def _replay(launches: list, *, present, free, ends, policy, now):
    """When the last of `launches` (in order) gets GPUs as the ends free them, and the end that let it;
    (None, None) when the known ends never free enough."""
    at, freed_by = now, None
    for launch in launches:
        gpus = SIZES[launch.size].gpus
        while (host := _host_for(gpus, present, free)) is None:
            if not ends:
                return None, None
            at, _, end = heapq.heappop(ends)
            free[end.host_id] += end.gpus
            freed_by = end
        free[host] -= gpus
        limit = sessions.session_limit(launch, policy)
        if limit is not None:
            ahead_ends = at + timedelta(seconds=limit.seconds)
            what = f"a {launch.size} launch ahead of you"
            heapq.heappush(ends, (ahead_ends, str(launch.id), _End(ahead_ends, host, gpus, what, "queued")))
        if launch is not launches[-1]:
            freed_by = None
    return at, freed_by


def median_wait(size: str, *, now: datetime) -> timedelta | None:
    """The median wait for GPUs of the latest launches of `size` in the window that had to wait."""
    rows = (
        GpuAllocation.objects.filter(instance__size=size, instance__created_at__gte=now - queue.window())
        .values("instance_id")
        .annotate(first=Min("allocated_at"))
        .values_list("instance__created_at", "first")
        .order_by("-instance__created_at")[:HISTORY_LAUNCHES]
    )
    waits = [first - created for created, first in rows if first - created > WAITED_AFTER]
    return timedelta(seconds=statistics.median(w.total_seconds() for w in waits)) if waits else None


def _minutes_text(delta: timedelta) -> str:
    minutes = round(delta.total_seconds() / 60)
    if minutes < 1:
        return "within a minute"
    if minutes < 60:
        return f"about {minutes} min"
    if minutes < 48 * 60:
        return f"about {minutes // 60} h {minutes % 60:02d} min"
    return f"about {round(minutes / 1440)} days"


def estimate(
    instance: Instance, *, now: datetime | None = None, place: "queue.Place | None" = None
) -> Estimate | None:
    """When the queued instance will likely start, with its basis; None when it is not queued.

    starts_at is when the known ends free GPUs it fits on for it and the launches ahead of it (so it is
    late only if a launch goes ahead of it later, a host fails, or GPUs go to a backend's own queue), or
    failing that its launch plus the recent median wait; None when neither tells.
    """
    now = now or timezone.now()
    place = place or queue.place_of(instance, now=now)
    if place is None:
        return None
    policy = LaunchPolicy.current()
    present, free, ends = _fleet(now, policy)
    launches = [standing.launch for standing in place.ahead] + [instance]
    starts_at, freed_by = _replay(launches, present=present, free=free, ends=ends, policy=policy, now=now)
    ahead = len(place.ahead)
    ahead_text = (
        "no launch is ahead of you"
        if not ahead
        else ("1 launch is ahead of you" if ahead == 1 else f"{ahead} launches are ahead of you")
    )
    recent = median_wait(instance.size, now=now)
    history = (
        f" Recently, {instance.size} launches that had to wait started after a median of "
        f"{queue.span_text(recent.total_seconds())}."
        if recent
        else ""
    )
    if starts_at is not None:
        when = f"{_minutes_text(starts_at - now)} (by {starts_at:%H:%M} UTC)"
        if freed_by is None:
            return Estimate(starts_at, f"{when}: {ahead_text}, and GPUs it fits on are free.{history}")
        because = ENDS_BECAUSE[freed_by.because]
        return Estimate(
            starts_at,
            f"{when}: {ahead_text}; {freed_by.what} ends by {freed_by.at:%H:%M} UTC {because}.{history}",
        )
    unknown = "the known ends of the instances running now do not free GPUs it fits on"
    if recent is not None:
        starts_at = max(instance.created_at + recent, now)
        return Estimate(
            starts_at,
            f"{_minutes_text(starts_at - now)}, going by recent waits: {ahead_text}, and {unknown}.{history}",
        )
    return Estimate(
        None, f"No estimate yet: {ahead_text}, {unknown}, and no recent {instance.size} launch had to wait."
    )
