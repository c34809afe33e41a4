from django.urls import path

from . import views

app_name = "accounts"
urlpatterns = [
    path("login/", views.login_view, name="login"),
    path("logout/", views.logout_view, name="logout"),
    path("signup/", views.signup, name="signup"),
    path("settings/", views.settings_view, name="settings"),
    path("verify/resend/", views.resend, name="resend"),
]
