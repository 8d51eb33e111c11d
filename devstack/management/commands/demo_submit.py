"""Submit every page of the bundled demo site through the public API.

With API_TOKENS set (or API_REQUIRE_TOKEN on) the submissions carry a token: the first of
API_TOKENS, else one issued to a `demo` user, so the demo pages have an owner.
"""

from __future__ import annotations

import time

import httpx2
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import BaseCommand, CommandError

from audits.api.auth import issue_token, tokens_required
from devstack.demo_site import DEMO_PATHS


class Command(BaseCommand):
    help = "Submit the demo site's pages to a running Plumb (waits for the API to answer)."

    def add_arguments(self, parser):
        parser.add_argument("--api", default="http://127.0.0.1:8000")
        parser.add_argument("--site", default="http://127.0.0.1:8099")
        parser.add_argument(
            "--wait", type=float, default=60.0, help="Seconds to wait for the API and site."
        )

    def handle(self, *args, api: str, site: str, wait: float, **options):
        deadline = time.monotonic() + wait
        with httpx2.Client(timeout=5, headers=self._authorization()) as client:
            for url in (f"{api}/healthz", f"{site}/"):
                while True:
                    try:
                        if client.get(url).status_code == 200:
                            break
                    except httpx2.HTTPError:
                        pass
                    if time.monotonic() > deadline:
                        raise CommandError(f"{url} did not answer within {wait:g}s")
                    time.sleep(0.5)
            for path in DEMO_PATHS:
                response = client.post(f"{api}/api/audits", json={"url": f"{site}{path}"})
                body = response.json()
                self.stdout.write(
                    f"demo: submitted {site}{path} -> {response.status_code} {body.get('links', body)}"
                )

    def _authorization(self) -> dict[str, str]:
        if not tokens_required():
            return {}
        if settings.API_TOKENS:
            token = next(iter(settings.API_TOKENS.values()))
        else:
            user, _ = get_user_model().objects.get_or_create(username="demo")
            _, token = issue_token(user, "make demo")
        return {"Authorization": f"Bearer {token}"}
