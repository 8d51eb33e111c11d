from django.urls import path

from audits.api.views import (
    AuditCollectionView,
    AuditDetailView,
    PageCollectionView,
    PageDetailView,
    QueueView,
)

urlpatterns = [
    path("audits", AuditCollectionView.as_view(), name="audit-collection"),
    path("audits/<str:audit_id>", AuditDetailView.as_view(), name="audit-detail"),
    path("pages", PageCollectionView.as_view(), name="page-collection"),
    path("pages/<str:page_id>", PageDetailView.as_view(), name="page-detail"),
    path("queue", QueueView.as_view(), name="queue"),
]
