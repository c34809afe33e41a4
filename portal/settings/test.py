"""pytest: PostgreSQL (DATABASE_URL), real Redis for the tests that start a worker, locmem email."""

from .base import *  # noqa: F403
from .base import DATABASES, env  # noqa: F401

DATABASES["default"] = env.db("DATABASE_URL", default="postgres://postgres@127.0.0.1:5432/devcloud")
DATABASES["default"]["TEST"] = {"NAME": env("TEST_DATABASE_NAME", default="test_devcloud")}
EMAIL_BACKEND = env("EMAIL_BACKEND", default="django.core.mail.backends.locmem.EmailBackend")
# Unit tests run tasks inline; tests marked `slow` start a real worker with eager mode off.
CELERY_TASK_ALWAYS_EAGER = env.bool("CELERY_TASK_ALWAYS_EAGER", default=True)
CELERY_TASK_EAGER_PROPAGATES = True
# The slow tests start one worker on a queue of their own; it serves launches too. The production smoke
# test (tests/deploy/) runs the real layout of portal/workers.py.
CELERY_PROVISIONING_QUEUE = env("CELERY_PROVISIONING_QUEUE", default="")
# Pages read the launch catalogue afresh, so a test sees what it just changed (with queryset.update() too);
# tests/instances/test_launch_catalogue_cache.py switches the cache on.
LAUNCH_CATALOGUE_CACHE_SECONDS = env.int("LAUNCH_CATALOGUE_CACHE_SECONDS", default=0)
# Argon2 as in production (same algorithm name), at a cost that keeps the suite fast.
PASSWORD_HASHERS = ["tests.support.hashers.CheapArgon2PasswordHasher"]
SECRET_KEY = env("SECRET_KEY", default="test-secret-key-not-for-production-0123456789abcdefghijklmnop")
# The suite's engines (this machine's, on ext4) cannot enforce disk limits; the tests of the limits
# (tests/fleet/test_disk_limits.py) switch to "enforce".
DEVCLOUD_DISK_LIMITS = env("DEVCLOUD_DISK_LIMITS", default="warn")
# The tests' OpenID Connect issuer (tests/support/oidc_issuer.py) serves plain HTTP on 127.0.0.1.
OIDC_ALLOW_INSECURE_LOOPBACK_ISSUERS = env.bool("OIDC_ALLOW_INSECURE_LOOPBACK_ISSUERS", default=True)
