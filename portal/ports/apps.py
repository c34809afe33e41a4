from django.apps import AppConfig


class PortsConfig(AppConfig):
    name = "portal.ports"
    label = "ports"
    verbose_name = "Exposed ports"
    default_auto_field = "django.db.models.BigAutoField"
