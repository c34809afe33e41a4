"""The dashboard's time range: presets, custom dates from the query string, and how finely to bucket it."""

from dataclasses import dataclass
from datetime import date, datetime, time, timedelta

from django.utils import timezone
from django.utils.dateparse import parse_date

PRESETS = {
    "24h": ("Last 24 hours", timedelta(days=1)),
    "7d": ("Last 7 days", timedelta(days=7)),
    "30d": ("Last 30 days", timedelta(days=30)),
    "90d": ("Last 90 days", timedelta(days=90)),
}
DEFAULT_PRESET = "7d"
# Longer custom ranges would draw more day buckets than a chart can show legibly.
MAX_CUSTOM_DAYS = 400

BUCKET_STEPS = {"minute": timedelta(minutes=1), "hour": timedelta(hours=1), "day": timedelta(days=1)}


@dataclass(frozen=True)
class TimeRange:
    key: str  # a PRESETS key or "custom"
    start: datetime
    end: datetime

    @property
    def span(self) -> timedelta:
        return self.end - self.start

    @property
    def label(self) -> str:
        if self.key in PRESETS:
            return PRESETS[self.key][0]
        last_day = (self.end - timedelta(microseconds=1)).date()
        return f"{self.start:%Y-%m-%d} to {last_day:%Y-%m-%d}"

    @property
    def sample_bucket(self) -> str:
        """Trunc kind for capacity samples: every sample for a day, hourly up to a month, then daily."""
        if self.span <= timedelta(hours=36):
            return "minute"
        return "hour" if self.span <= timedelta(days=31) else "day"

    @property
    def period_bucket(self) -> str:
        """Trunc kind for totals (burn, grants, sign-ups, waits): hourly bars for short ranges, else daily."""
        return "hour" if self.span <= timedelta(days=3) else "day"


def bucket_floor(moment: datetime, bucket: str) -> datetime:
    moment = timezone.localtime(moment)
    if bucket == "day":
        return moment.replace(hour=0, minute=0, second=0, microsecond=0)
    if bucket == "hour":
        return moment.replace(minute=0, second=0, microsecond=0)
    return moment.replace(second=0, microsecond=0)


def buckets(time_range: TimeRange, bucket: str) -> list[datetime]:
    """Every bucket start from the one holding time_range.start up to before time_range.end."""
    step = BUCKET_STEPS[bucket]
    current, found = bucket_floor(time_range.start, bucket), []
    while current < time_range.end:
        found.append(current)
        current += step
    return found


def preset(key: str, *, now: datetime) -> TimeRange:
    return TimeRange(key=key, start=now - PRESETS[key][1], end=now)


def parse_day(raw: str, name: str) -> tuple[date | None, str | None]:
    """Parses YYYY-MM-DD. Returns (date, None), (None, None) when empty, or (None, error message)."""
    raw = (raw or "").strip()
    if not raw:
        return None, None
    try:
        parsed = parse_date(raw)
    except ValueError:
        parsed = None
    if parsed is None:
        return None, f"“{raw[:40]}” is not a date for “{name}”; use YYYY-MM-DD."
    return parsed, None


def day_start(day: date) -> datetime:
    return timezone.make_aware(datetime.combine(day, time.min))


def resolve_range(params, *, now: datetime | None = None) -> tuple[TimeRange, list[str]]:
    """The range the query string asks for: ?range=<preset key>, or ?range=custom&from=YYYY-MM-DD&to=YYYY-MM-DD.

    `from` and `to` are whole days, both included; a range reaching past now ends now. Returns the
    range and a list of error messages; when there are errors, the range is the default preset (the page
    says so).
    """
    now = now or timezone.now()
    key = (params.get("range") or "").strip()
    raw_from, raw_to = params.get("from", ""), params.get("to", "")
    if not key:
        key = "custom" if (raw_from or raw_to) else DEFAULT_PRESET
    if key in PRESETS:
        return preset(key, now=now), []
    if key != "custom":
        return preset(DEFAULT_PRESET, now=now), [
            f"Unknown range “{key[:40]}”; pick one of {', '.join(PRESETS)} or dates."
        ]

    first, from_error = parse_day(raw_from, "from")
    last, to_error = parse_day(raw_to, "to")
    errors = [error for error in (from_error, to_error) if error]
    if not errors:
        if first is None or last is None:
            errors.append("A custom range needs both a “from” and a “to” date.")
        elif first > last:
            errors.append(
                f"The range starts ({first}) after it ends ({last}); pick a “from” date before the “to” date."
            )
        elif (last - first).days + 1 > MAX_CUSTOM_DAYS:
            errors.append(f"A custom range can span at most {MAX_CUSTOM_DAYS} days.")
        elif day_start(first) >= now:
            errors.append(f"The range starts ({first}) in the future.")
    if errors:
        return preset(DEFAULT_PRESET, now=now), errors
    end = min(day_start(last) + timedelta(days=1), now)
    return TimeRange(key="custom", start=day_start(first), end=end), []
