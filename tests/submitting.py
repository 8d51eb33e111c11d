"""Submitting an audit in a test: the one helper for each way in.

- `submit(url)`: what POST /api/audits does once admitted, in this process: the audit
  row, its message enqueued when the transaction commits (at once under
  transactional_db, which every test with a real worker has through `start_worker`).
- `post_audit(client, url_or_body)`: POST /api/audits itself, through a DRF APIClient
  (in process), an httpx2.Client whose base_url is a running Plumb, or such a base URL.
"""

from __future__ import annotations

import json

import httpx2
from rest_framework.test import APIClient

from audits import submission
from audits.models import Audit
from outbound.urls import normalize_url


def submit(url: str) -> Audit:
    return submission.submit_audit(normalize_url(url))


def post_audit(
    client: APIClient | httpx2.Client | str,
    body: str | dict,
    *,
    expect: int | None = None,
    **extra,
):
    """POST /api/audits with `body`: a URL alone, or the whole JSON body. `extra`: the
    APIClient request's own arguments (REMOTE_ADDR=...). With `expect`, fail unless that
    is the answer's status."""
    body = {"url": body} if isinstance(body, str) else body
    if isinstance(client, str):
        response = httpx2.post(f"{client}/api/audits", json=body, timeout=10)
    elif isinstance(client, httpx2.Client):
        response = client.post("/api/audits", json=body)
    else:
        response = client.post(
            "/api/audits", data=json.dumps(body), content_type="application/json", **extra
        )
    if expect is not None:
        assert response.status_code == expect, response.content
    return response
