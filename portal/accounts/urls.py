from django.urls import path

from . import views

app_name = "accounts"
urlpatterns = [
    path("signup/", views.signup, name="signup"),
    path("login/", views.login_view, name="login"),
    path("logout/", views.logout_view, name="logout"),
    path("verify/resend/", views.resend, name="resend"),
    path("verify/<uidb64>/<token>/", views.verify, name="verify"),
    path("password/reset/", views.password_reset, name="password_reset"),
    path("password/reset/sent/", views.password_reset_done, name="password_reset_done"),
    path("password/reset/<uidb64>/<token>/", views.password_reset_confirm, name="password_reset_confirm"),
    path("password/reset/done/", views.password_reset_complete, name="password_reset_complete"),
    path("settings/", views.settings_view, name="settings"),
    path("settings/email/", views.email_change, name="email_change"),
    path("settings/email/cancel/", views.email_change_cancel, name="email_change_cancel"),
    path("email/confirm/<uidb64>/<token>/", views.email_confirm, name="email_confirm"),
    path("settings/password/", views.password_change, name="password_change"),
    path("settings/ssh-keys/", views.sshkey_add, name="sshkey_add"),
    path("settings/ssh-keys/<int:key_id>/delete/", views.sshkey_delete, name="sshkey_delete"),
    path("settings/api-tokens/", views.api_token_create, name="api_token_create"),
    path("settings/api-tokens/<int:token_id>/revoke/", views.api_token_revoke, name="api_token_revoke"),
    path("settings/delete/", views.account_delete, name="account_delete"),
]
