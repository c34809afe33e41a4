from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("", include("portal.credits.urls")),
    path("accounts/", include("portal.accounts.urls")),
    path("instances/", include("portal.instances.urls")),
    path("notifications/", include("portal.notifications.urls")),
    path("console/", include("portal.console.urls")),
    path("auth/", include("social_django.urls", namespace="social")),
    path("admin/", admin.site.urls),
    path("api/", include("portal.api.urls")),
]
