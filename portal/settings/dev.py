"""`make run`: SQLite, the local Docker engine or a fallback, email printed to the console."""

from .base import *  # noqa: F403
from .base import BASE_DIR, env

(BASE_DIR / "var").mkdir(exist_ok=True)

DEBUG = env.bool("DEBUG", default=True)
# Static files are copied, not compressed: whitenoise's gzip and brotli pass over every file (20 MB with
# the API docs' assets) took most of `make run`'s start on a small machine, every time. Production
# (base settings) serves them compressed.
STORAGES = {**STORAGES, "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"}}  # noqa: F405
# `make run` uses this machine's engine, whose data root is rarely on XFS with pquota: instances start
# without disk limits, and the instance's page says so (base.py, DEVCLOUD_DISK_LIMITS).
DEVCLOUD_DISK_LIMITS = env("DEVCLOUD_DISK_LIMITS", default="warn")
