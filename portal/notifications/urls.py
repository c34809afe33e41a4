from django.urls import path

from . import views

app_name = "notifications"
urlpatterns = [
    path("", views.notification_list, name="list"),
    path("read/", views.notification_mark_all_read, name="mark_all_read"),
    path("preferences/", views.preferences, name="preferences"),
]
