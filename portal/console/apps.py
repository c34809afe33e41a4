from django.apps import AppConfig


class ConsoleConfig(AppConfig):
    name = "portal.console"
    label = "console"

    def ready(self):
        # Connects the Celery signal handlers that record beat runs, launches and email failures.
        from . import instrumentation  # noqa: F401
