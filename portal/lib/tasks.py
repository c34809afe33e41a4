"""Publishing Celery tasks from web requests without letting a broker outage break the page."""

import logging
import random

import kombu.exceptions
import redis.exceptions
from django.conf import settings

log = logging.getLogger(__name__)

# What a publish raises when Redis is down or unreachable (OSError covers refused and timed-out sockets).
BROKER_ERRORS = (kombu.exceptions.OperationalError, redis.exceptions.RedisError, OSError)


def publish(task, *, args=(), kwargs=None, inline=None) -> bool:
    """Hand `task` to a worker. Returns True when it was published.

    When the broker is unreachable it logs that and, if `inline` is given, calls it in this process
    instead (its own failure is logged, not raised: the caller's request has already succeeded).
    Returns False then.
    """
    try:
        task.apply_async(args=args, kwargs=kwargs or {}, retry=False)
        return True
    except BROKER_ERRORS as error:
        log.warning("Broker unreachable (%s): could not publish %s", error, task.name)
    if inline is not None:
        try:
            inline()
        except Exception:
            log.exception("Running %s inline failed as well", task.name)
    return False


# Waits between retries of a task: 2, 4, 8, 16, 32 s plus jitter; never more than this.
MAX_RETRY_DELAY_SECONDS = 120


def retry_delay(retries: int) -> float:
    """Seconds to wait before retry number `retries + 1`: exponential, jittered, and capped well under the
    broker visibility timeout (a longer ETA would make Redis hand the message to a second worker)."""
    visibility = settings.CELERY_BROKER_TRANSPORT_OPTIONS.get("visibility_timeout", 3600)
    cap = min(MAX_RETRY_DELAY_SECONDS, visibility // 4)
    return min(2 ** (retries + 1), cap) + random.uniform(0, 1)


def redelivered(task) -> bool:
    """Whether the broker handed this message out again after losing the worker that had it: the run it
    replaces may have got halfway, so the task resumes rather than starts."""
    return bool((task.request.delivery_info or {}).get("redelivered"))
