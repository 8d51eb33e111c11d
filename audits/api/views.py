from __future__ import annotations

import uuid

from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.exceptions import NotFound
from rest_framework.pagination import PageNumberPagination
from rest_framework.response import Response
from rest_framework.views import APIView

from audits import services
from audits.api.serializers import (
    AuditListQuerySerializer,
    AuditSerializer,
    AuditSubmissionSerializer,
)
from audits.models import Audit


def _is_uuid(value: str) -> bool:
    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True


class AuditPagination(PageNumberPagination):
    page_size = 20
    page_size_query_param = "page_size"
    max_page_size = 100


class AuditCollectionView(APIView):
    @extend_schema(request=AuditSubmissionSerializer, responses={202: AuditSerializer})
    def post(self, request):
        submission = AuditSubmissionSerializer(data=request.data)
        submission.is_valid(raise_exception=True)
        data = submission.validated_data
        audit = services.submit_audit(
            data["url"],
            callback_url=data.get("callback_url", ""),
            callback_secret=data.get("callback_secret", ""),
        )
        body = AuditSerializer(audit, context={"request": request}).data
        return Response(
            body, status=status.HTTP_202_ACCEPTED, headers={"Location": body["links"]["self"]}
        )

    @extend_schema(parameters=[AuditListQuerySerializer], responses=AuditSerializer(many=True))
    def get(self, request):
        query = AuditListQuerySerializer(data=request.query_params.dict())
        query.is_valid(raise_exception=True)
        filters = {k: v for k, v in query.validated_data.items() if k in {"status", "trigger"}}
        audits = (
            Audit.objects.select_related("page").filter(**filters).order_by("-created_at", "-id")
        )
        paginator = AuditPagination()
        page = paginator.paginate_queryset(audits, request, view=self)
        return paginator.get_paginated_response(
            AuditSerializer(page, many=True, context={"request": request}).data
        )


class AuditDetailView(APIView):
    @extend_schema(responses=AuditSerializer)
    def get(self, request, audit_id):
        audit = None
        if _is_uuid(audit_id):
            audit = Audit.objects.select_related("page").filter(id=audit_id).first()
        if audit is None:
            raise NotFound("No audit with that id.")
        return Response(AuditSerializer(audit, context={"request": request}).data)
