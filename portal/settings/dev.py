"""`make run`: SQLite, the local Docker engine or a fallback, email printed to the console."""

from .base import *  # noqa: F403
from .base import BASE_DIR, env

(BASE_DIR / "var").mkdir(exist_ok=True)

DEBUG = env.bool("DEBUG", default=True)
