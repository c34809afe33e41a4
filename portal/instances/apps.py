from django.apps import AppConfig


class InstancesConfig(AppConfig):
    name = "portal.instances"
    label = "instances"
