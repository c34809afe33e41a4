from django.apps import AppConfig


class SshGatewayConfig(AppConfig):
    name = "portal.sshgateway"
    label = "sshgateway"
    verbose_name = "SSH gateway"
    default_auto_field = "django.db.models.BigAutoField"
