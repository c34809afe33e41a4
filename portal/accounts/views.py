from django.contrib.auth import views as auth_views
from django.shortcuts import render


def rate_limited(request, exception):
    return render(request, "accounts/rate_limited.html", status=429)


login_view = auth_views.LoginView.as_view(template_name="accounts/login.html")
logout_view = auth_views.LogoutView.as_view()


def signup(request):
    return render(request, "accounts/signup.html")


def settings_view(request):
    return render(request, "accounts/settings.html")


def resend(request):
    return render(request, "accounts/settings.html")
