from __future__ import annotations

import uuid

import redis
from django.conf import settings
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.exceptions import NotFound, Throttled
from rest_framework.pagination import PageNumberPagination
from rest_framework.response import Response
from rest_framework.views import APIView

from audits import admission, pages, submission
from audits.api.auth import TokenRequiredWhenConfigured, TrustedCallerOnly, caller, is_trusted
from audits.api.errors import ClientBacklogFull, ServiceUnavailable
from audits.api.schema import error
from audits.api.serializers import (
    AuditListQuerySerializer,
    AuditSerializer,
    AuditSubmissionSerializer,
    PageDetailSerializer,
    PageHistoryQuerySerializer,
    PageListQuerySerializer,
    PageSerializer,
    PageUpdateSerializer,
)
from audits.models import Audit, Page


def _uuid_or_none(value: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(value)
    except ValueError:
        return None


def _page_or_404(request, page_id: str) -> Page:
    """The caller's page (staff: any page). Another's is 404 like a missing one, 403 would
    say it exists."""
    public_id = _uuid_or_none(page_id)
    page = None if public_id is None else pages.readable(caller(request), public_id)
    if page is None:
        raise NotFound("No page with that id.")
    return page


class AuditPagination(PageNumberPagination):
    page_size = 20
    page_size_query_param = "page_size"
    max_page_size = 100


def admit(request, client: str) -> admission.Decision:
    """The admission of this submission from `client` (admission.client_key) by its
    bucket and the backlog; raise its refusal, if it is refused. Nothing is written."""
    ip = admission.client_ip(request.META, trusted_proxy_count=settings.TRUSTED_PROXY_COUNT)
    try:
        decision = admission.admit_submission(ip)
    except admission.AdmissionUnavailable:
        raise ServiceUnavailable(
            "Submissions cannot be checked against the queue right now; nothing was "
            "written. Try again shortly.",
            code="admission_unavailable",
            retry_after=5,
        ) from None
    if decision.outcome == admission.REFUSED_IP:
        raise Throttled(wait=decision.retry_after, detail="Too many submissions from this address.")
    if decision.outcome == admission.REFUSED_BACKLOG:
        # A client holding its share is told so, full backlog or not: it is its own wait.
        held = admission.client_holding(client)
        if held >= decision.client_share:
            raise client_backlog_full(admission.refuse_client(decision, held))
        raise ServiceUnavailable(
            "The audit backlog is full; nothing was written. Try again later.",
            code="backlog_full",
            retry_after=decision.retry_after,
            extra={"backlog": decision.backlog, "max_depth": decision.max_depth},
        )
    return decision


def client_backlog_full(refused: admission.Decision) -> ClientBacklogFull:
    return ClientBacklogFull(
        "Your audits already hold your share of the backlog; nothing was written. "
        "Try again once some of them have finished.",
        retry_after=refused.retry_after,
        extra={"held": refused.client_held, "share": refused.client_share},
    )


class AuditCollectionView(APIView):
    pagination_class = AuditPagination

    def get_permissions(self):
        if self.request.method == "GET":
            return [TokenRequiredWhenConfigured(), TrustedCallerOnly()]
        return super().get_permissions()

    @extend_schema(
        request=AuditSubmissionSerializer,
        responses={202: AuditSerializer, **error(429), **error(503)},
    )
    def post(self, request):
        submitted = AuditSubmissionSerializer(data=request.data)
        submitted.is_valid(raise_exception=True)
        client = admission.client_key(request)
        decision = admit(request, client)
        data = submitted.validated_data
        try:
            audit = submission.submit_audit(
                data["url"],
                client=client,
                callback_url=data.get("callback_url", ""),
                callback_secret=data.get("callback_secret", ""),
                trusted=is_trusted(request),
                submitter=caller(request),
            )
        except submission.ClientShareHeld as over:
            raise client_backlog_full(admission.refuse_client(decision, over.held)) from None
        body = AuditSerializer(audit, context={"request": request, "submitted": True}).data
        return Response(
            body, status=status.HTTP_202_ACCEPTED, headers={"Location": body["links"]["self"]}
        )

    @extend_schema(parameters=[AuditListQuerySerializer], responses=AuditSerializer(many=True))
    def get(self, request):
        query = AuditListQuerySerializer(data=request.query_params.dict())
        query.is_valid(raise_exception=True)
        filters = {k: v for k, v in query.validated_data.items() if k in {"status", "trigger"}}
        audits = pages.audits_listed(request.user, **filters)
        paginator = self.pagination_class()
        page = paginator.paginate_queryset(audits, request, view=self)
        return paginator.get_paginated_response(
            AuditSerializer(page, many=True, context={"request": request}).data
        )


AUDIT_ID = OpenApiParameter(
    "audit_id", OpenApiTypes.UUID, OpenApiParameter.PATH, description="The audit's id."
)
PAGE_ID = OpenApiParameter(
    "page_id", OpenApiTypes.UUID, OpenApiParameter.PATH, description="The page's id."
)


class AuditDetailView(APIView):
    @extend_schema(parameters=[AUDIT_ID], responses=AuditSerializer)
    def get(self, request, audit_id):
        audit = None
        if _uuid_or_none(audit_id) is not None:
            audit = Audit.objects.select_related("page").filter(id=audit_id).first()
        if audit is None:
            raise NotFound("No audit with that id.")
        return Response(AuditSerializer(audit, context={"request": request}).data)


QUEUE_DEPTH = inline_serializer(
    "QueueDepth",
    {
        **{
            name: serializers.IntegerField(min_value=0)
            for name in (
                "backlog",
                "waiting",
                "retrying",
                "running",
                "max_depth",
                # Waits past the horizon (RATELIMIT_MAX_WAIT_SECONDS): seen, not in `backlog`.
                "deferred_beyond_horizon",
            )
        },
        # Read from the database: null while it is away (the rest is Redis's).
        "scheduled": serializers.IntegerField(min_value=0, allow_null=True),
    },
)


class QueueView(APIView):
    @extend_schema(responses={200: QUEUE_DEPTH, **error(503)})
    def get(self, request):
        try:
            return Response(admission.queue_report())
        except redis.RedisError:
            raise ServiceUnavailable(
                "The queue cannot be read right now.", code="queue_unavailable", retry_after=5
            ) from None


class PageCollectionView(APIView):
    permission_classes = [TokenRequiredWhenConfigured, TrustedCallerOnly]
    pagination_class = AuditPagination

    @extend_schema(parameters=[PageListQuerySerializer], responses=PageSerializer(many=True))
    def get(self, request):
        query = PageListQuerySerializer(data=request.query_params.dict())
        query.is_valid(raise_exception=True)
        listed = pages.listed(
            request.user,
            **{k: v for k, v in query.validated_data.items() if k not in {"page", "page_size"}},
        )
        paginator = self.pagination_class()
        page = paginator.paginate_queryset(listed, request, view=self)
        return paginator.get_paginated_response(
            PageSerializer(page, many=True, context={"request": request}).data
        )


class PageDetailView(APIView):
    permission_classes = [TokenRequiredWhenConfigured, TrustedCallerOnly]

    @extend_schema(parameters=[PAGE_ID, PageHistoryQuerySerializer], responses=PageDetailSerializer)
    def get(self, request, page_id):
        page = _page_or_404(request, page_id)
        query = PageHistoryQuerySerializer(data=request.query_params.dict())
        query.is_valid(raise_exception=True)
        paginator = AuditPagination()
        history = paginator.paginate_queryset(pages.history(page), request, view=self)
        audits = paginator.get_paginated_response(
            AuditSerializer(history, many=True, context={"request": request}).data
        ).data
        context = {"request": request, "audit_history": audits}
        return Response(PageDetailSerializer(pages.with_latest_audit(page), context=context).data)

    @extend_schema(parameters=[PAGE_ID], request=PageUpdateSerializer, responses=PageSerializer)
    def patch(self, request, page_id):
        page = _page_or_404(request, page_id)
        update = PageUpdateSerializer(data=request.data)
        update.is_valid(raise_exception=True)
        page = pages.update(page, **update.validated_data)
        return Response(PageSerializer(page, context={"request": request}).data)

    @extend_schema(parameters=[PAGE_ID], responses={204: None})
    def delete(self, request, page_id):
        pages.remove(_page_or_404(request, page_id))
        return Response(status=status.HTTP_204_NO_CONTENT)
