from django.urls import path

from . import views

app_name = "credits"
urlpatterns = [
    path("", views.dashboard, name="dashboard"),
    path("history/", views.history, name="history"),
    path("bonus/", views.bonus, name="bonus"),
    path("efficiency/", views.efficiency_report, name="efficiency"),
]
