"""pytest: PostgreSQL (DATABASE_URL), real Redis for the tests that start a worker, locmem email."""

from .base import *  # noqa: F403
from .base import DATABASES, env

DATABASES["default"]["TEST"] = {"NAME": env("TEST_DATABASE_NAME", default="test_devcloud")}
EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
# Unit tests run tasks inline; tests marked `slow` start a real worker with eager mode off.
CELERY_TASK_ALWAYS_EAGER = True
CELERY_TASK_EAGER_PROPAGATES = True
PASSWORD_HASHERS = ["django.contrib.auth.hashers.Argon2PasswordHasher"]
SECRET_KEY = "test-secret-key-not-for-production-0123456789abcdefghijklmnop"
