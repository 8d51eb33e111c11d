from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView

urlpatterns = [
    path("api/", include("audits.urls")),
    path("api/schema", SpectacularAPIView.as_view(), name="schema"),
    path("admin/", admin.site.urls),
    path("", include("observability.urls")),
]

handler404 = "audits.api.errors.json_not_found"
handler500 = "audits.api.errors.json_server_error"
