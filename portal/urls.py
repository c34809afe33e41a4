from django.contrib import admin
from django.urls import include, path

from portal.api.pages import ci_access
from provisioning.slurm.callback import job_report_view

urlpatterns = [
    path("", include("portal.credits.urls")),
    path("accounts/", include("portal.accounts.urls")),
    path("instances/", include("portal.instances.urls")),
    path("instances/", include("portal.ports.urls")),
    # A project's CI access page lives with the tokens it manages (portal/api/pages.py).
    path("projects/<slug:slug>/ci/", ci_access, name="project_ci_access"),
    path("projects/", include("portal.projects.urls")),
    path("notifications/", include("portal.notifications.urls")),
    path("console/", include("portal.console.urls")),
    path("auth/", include("social_django.urls", namespace="social")),
    path("admin/", admin.site.urls),
    path("api/", include("portal.api.urls")),
    # Slurm jobs report where they run (provisioning/slurm/callback.py).
    path("slurm/jobs/<uuid:instance_id>/report", job_report_view, name="slurm-job-report"),
]
