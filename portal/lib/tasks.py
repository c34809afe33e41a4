"""Publishing Celery tasks from web requests without letting a broker outage break the page."""

import logging

import kombu.exceptions
import redis.exceptions

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
