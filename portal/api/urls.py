from django.urls import path, re_path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from . import views

app_name = "api"
urlpatterns = [
    path("schema/", SpectacularAPIView.as_view(), name="schema"),
    path("docs/", SpectacularSwaggerView.as_view(url_name="api:schema"), name="docs"),
    path("v1/me", views.me, name="me"),
    path("v1/ssh", views.ssh, name="ssh"),
    path("v1/ledger", views.LedgerView.as_view(), name="ledger"),
    path("v1/sizes", views.sizes, name="sizes"),
    path("v1/images", views.images, name="images"),
    path("v1/instances", views.instances, name="instances"),
    path("v1/instances/<uuid:instance_id>", views.instance_detail, name="instance"),
    path("v1/instances/<uuid:instance_id>/stop", views.instance_stop, name="instance_stop"),
    path("v1/instances/<uuid:instance_id>/extend", views.instance_extend, name="instance_extend"),
    path("v1/instances/<uuid:instance_id>/logs", views.instance_logs, name="instance_logs"),
    path("v1/instances/<uuid:instance_id>/ports", views.instance_ports, name="instance_ports"),
    path("v1/instances/<uuid:instance_id>/ports/<int:port>", views.instance_port_close, name="instance_port"),
    path(
        "v1/instances/<uuid:instance_id>/ports/<int:port>/shares",
        views.instance_port_shares,
        name="instance_port_shares",
    ),
    path(
        "v1/instances/<uuid:instance_id>/ports/<int:port>/shares/<int:share_id>",
        views.instance_port_share_revoke,
        name="instance_port_share",
    ),
    path("v1/reservations", views.reservations_view, name="reservations"),
    path("v1/reservations/availability", views.reservations_availability, name="reservations_availability"),
    path("v1/reservations/<uuid:reservation_id>", views.reservation_detail, name="reservation"),
    path("v1/projects", views.projects, name="projects"),
    path("v1/projects/<str:slug>", views.project_detail, name="project"),
    path("v1/projects/<str:slug>/tokens", views.project_tokens, name="project_tokens"),
    path("v1/projects/<str:slug>/invitations", views.project_invitations, name="project_invitations"),
    path(
        "v1/projects/<str:slug>/invitations/<int:invitation_id>",
        views.project_invitation_revoke,
        name="project_invitation",
    ),
    path("v1/projects/<str:slug>/members/<int:user_id>", views.project_member, name="project_member"),
    path("v1/projects/<str:slug>/ci-grant-application", views.project_ci_grant, name="project_ci_grant"),
    path("v1/projects/<str:slug>/tokens/<int:token_id>", views.project_token_revoke, name="project_token"),
    path("v1/projects/<str:slug>/trusted-publishers", views.project_trust, name="project_trust"),
    path(
        "v1/projects/<str:slug>/trusted-publishers/<int:publisher_id>",
        views.project_trust_remove,
        name="project_trust_remove",
    ),
    path("v1/oidc", views.oidc_settings, name="oidc"),
    path("v1/oidc/token", views.oidc_token, name="oidc_token"),
    path("v1/ssh-keys", views.ssh_keys, name="ssh_keys"),
    path("v1/ssh-keys/<int:key_id>", views.ssh_key_delete, name="ssh_key"),
    path("v1/bonus-programs", views.bonus_programs, name="bonus_programs"),
    path("v1/bonus-applications", views.bonus_applications, name="bonus_applications"),
    re_path(r"^.*$", views.not_found),
]
