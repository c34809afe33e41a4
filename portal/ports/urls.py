from django.urls import path

from . import views

app_name = "ports"
urlpatterns = [
    path("<uuid:instance_id>/ports/", views.ports_page, name="page"),
    path("<uuid:instance_id>/ports/expose/", views.port_expose, name="expose"),
    path("<uuid:instance_id>/ports/<int:port>/close/", views.port_close, name="close"),
    path("<uuid:instance_id>/ports/<int:port>/shares/", views.share_create, name="share"),
    path("<uuid:instance_id>/ports/shares/<int:share_id>/revoke/", views.share_revoke, name="revoke"),
]
