from django.urls import path

from . import views

app_name = "console"

urlpatterns = [
    path("", views.dashboard, name="dashboard"),
    path("audit/", views.audit, name="audit"),
    path("audit/export.csv", views.audit_export, name="audit_export"),
    path("efficiency/", views.efficiency, name="efficiency"),
    path("efficiency/export.csv", views.efficiency_export, name="efficiency_export"),
]
