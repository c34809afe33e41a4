from django.urls import path

from . import views

app_name = "instances"
urlpatterns = [
    path("", views.instance_list, name="list"),
]
