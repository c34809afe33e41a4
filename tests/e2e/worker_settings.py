"""Settings of the e2e workers that test redelivery: the test settings with a broker visibility timeout
of a few seconds (E2E_VISIBILITY_TIMEOUT), so a message whose worker was killed is handed to the next
worker within the test rather than after an hour. What depends on the timeout follows it, as it would in
production: the instance tasks keep their retry delays under a quarter of it (portal/lib/tasks.py).

Only this one value differs from portal.settings.test; the worker is otherwise the one every test runs.
"""

from portal.settings.test import *
from portal.settings.test import CELERY_BROKER_TRANSPORT_OPTIONS, env

CELERY_BROKER_TRANSPORT_OPTIONS = {
    **CELERY_BROKER_TRANSPORT_OPTIONS,
    "visibility_timeout": env.int("E2E_VISIBILITY_TIMEOUT", default=4),
    # Look for abandoned messages on every poll, not every tenth (kombu's throttle).
    "unacked_restore_throttle": 1,
    "unacked_restore_interval": 1,
}
