from django.apps import AppConfig
from django.db.models.signals import post_delete, post_save


class InstancesConfig(AppConfig):
    name = "portal.instances"
    label = "instances"

    def ready(self):
        from portal.credits.models import BonusProgram
        from provisioning.models import GpuHost, HostImage, ImageJob

        from .models import Image, LaunchPolicy
        from .selectors import forget_launch_catalogue

        # This process forgets its copy of the launch catalogue when it saves any part of it; other web
        # processes see the change within LAUNCH_CATALOGUE_CACHE_SECONDS.
        for model in (Image, LaunchPolicy, BonusProgram, GpuHost, HostImage, ImageJob):
            post_save.connect(forget_launch_catalogue, sender=model, dispatch_uid=f"catalogue-{model.__name__}")
            post_delete.connect(forget_launch_catalogue, sender=model, dispatch_uid=f"catalogue-{model.__name__}-d")
