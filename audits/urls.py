from django.urls import path

from audits.api.views import AuditCollectionView, AuditDetailView, QueueView

urlpatterns = [
    path("audits", AuditCollectionView.as_view(), name="audit-collection"),
    path("audits/<str:audit_id>", AuditDetailView.as_view(), name="audit-detail"),
    path("queue", QueueView.as_view(), name="queue"),
]
