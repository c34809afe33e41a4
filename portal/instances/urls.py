from django.urls import path

from . import views

app_name = "instances"
urlpatterns = [
    path("", views.instance_list, name="list"),
    path("launch/", views.instance_launch, name="launch"),
    path("<uuid:instance_id>/", views.instance_detail, name="detail"),
    path("<uuid:instance_id>/status.json", views.instance_status, name="status"),
    path("<uuid:instance_id>/stop/", views.instance_stop, name="stop"),
    path("<uuid:instance_id>/extend/", views.instance_extend, name="extend"),
    path("reservations/", views.reservation_list, name="reservations"),
    path("reservations/<uuid:reservation_id>/cancel/", views.reservation_cancel, name="reservation_cancel"),
]
