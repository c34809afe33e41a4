from django.urls import path

from . import views

app_name = "projects"
urlpatterns = [
    path("", views.project_list, name="list"),
    path("invitations/<str:token>/", views.invitation, name="invitation"),
    path("<slug:slug>/", views.project_detail, name="detail"),
    path("<slug:slug>/invite/", views.project_invite, name="invite"),
    path("<slug:slug>/limits/", views.project_limits, name="limits"),
    path("<slug:slug>/ci-grant/", views.ci_grant_apply, name="ci_grant_apply"),
    path("<slug:slug>/members/<int:user_id>/remove/", views.member_remove, name="member_remove"),
    path("<slug:slug>/members/<int:user_id>/role/", views.member_role, name="member_role"),
    path(
        "<slug:slug>/invitations/<int:invitation_id>/revoke/",
        views.invitation_revoke,
        name="invitation_revoke",
    ),
    path("<slug:slug>/instances/<uuid:instance_id>/stop/", views.instance_stop, name="instance_stop"),
]
