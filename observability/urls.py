from django.urls import path

from observability import health, views

urlpatterns = [
    path("healthz", health.healthz, name="healthz"),
    path("metrics", views.metrics, name="metrics"),
    path("api/stats", views.api_stats, name="api-stats"),
    path("dashboard/", views.dashboard, name="dashboard"),
]
