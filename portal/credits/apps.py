from django.apps import AppConfig


class CreditsConfig(AppConfig):
    name = "portal.credits"
    label = "credits"
