from django.urls import path

from observability import views

urlpatterns = [
    path("metrics", views.metrics, name="metrics"),
    path("api/stats", views.api_stats, name="api-stats"),
    path("dashboard/", views.dashboard, name="dashboard"),
]
