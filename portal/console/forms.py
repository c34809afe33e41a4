"""Query-string filters of the audit page, parsed leniently: a bad value is reported and ignored."""

from dataclasses import dataclass, field
from datetime import date, timedelta
from urllib.parse import urlencode

from .timeranges import day_start, parse_day


@dataclass
class AuditFilters:
    query: str = ""
    action: str = ""
    day_from: date | None = None
    day_to: date | None = None
    errors: list[str] = field(default_factory=list)

    @classmethod
    def from_params(cls, params) -> "AuditFilters":
        """Reads ?q=&action=&from=YYYY-MM-DD&to=YYYY-MM-DD (days included); collects errors, never raises."""
        filters = cls(
            query=(params.get("q") or "").strip()[:200], action=(params.get("action") or "").strip()[:50]
        )
        filters.day_from, from_error = parse_day(params.get("from", ""), "from")
        filters.day_to, to_error = parse_day(params.get("to", ""), "to")
        filters.errors = [error for error in (from_error, to_error) if error]
        if filters.day_from and filters.day_to and filters.day_from > filters.day_to:
            filters.errors.append(
                f"The range starts ({filters.day_from}) after it ends ({filters.day_to}); "
                "the dates are ignored."
            )
            filters.day_from = filters.day_to = None
        return filters

    def selector_kwargs(self) -> dict:
        return {
            "query": self.query,
            "action": self.action,
            "start": day_start(self.day_from) if self.day_from else None,
            "end": day_start(self.day_to) + timedelta(days=1) if self.day_to else None,
        }

    def querystring(self) -> str:
        """The filters as a query string (without the page), for the export link and pagination."""
        params = {
            "q": self.query,
            "action": self.action,
            "from": self.day_from.isoformat() if self.day_from else "",
            "to": self.day_to.isoformat() if self.day_to else "",
        }
        return urlencode({key: value for key, value in params.items() if value})

    @property
    def active(self) -> bool:
        return bool(self.query or self.action or self.day_from or self.day_to)
