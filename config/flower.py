"""Flower's login, made to cover /metrics and throttled (loaded by flowerconfig.py).

Flower 2.2 checks its basic auth in `get_current_user`, which only its pages marked
`authenticated` call: /metrics (every task name, every worker, queue depths) answered
anyone. And a wrong password costs nothing, so it can be guessed at line speed.
django-axes throttles Django's logins; Flower is a Tornado app that never reaches
Django's authentication, so its failures are counted here, in its one process, with
the same limits (LOGIN_FAILURE_LIMIT failures from one address lock it out for
LOGIN_LOCKOUT_MINUTES), in memory bounded by construction (LoginFailures). /healthcheck stays open: docker-compose polls it.

The throttle wraps `BaseHandler.get_current_user` (the one place Flower decides who
is logged in) and calls the original; tests/test_flower.py pins both behaviours
against the installed Flower. `BaseHandler.get_broker` is replaced too, so the Broker
page reads Plumb's queues through its transport.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable

import tornado.web
from django.conf import settings
from flower import urls
from flower.utils.broker import Broker
from flower.views import BaseHandler
from flower.views.monitor import Metrics


class LoginFailures:
    """Failed logins per client address within the lockout window, bounded in memory.

    An address keeps its last `limit` failures only (what a lockout needs), and is
    forgotten once its newest failure is older than the window. At most `max_addresses`
    are kept: past that, the address whose newest failure is oldest goes first. Evicting
    one locked address takes `max_addresses` failures from other addresses, each a guess
    that was counted, so the bound costs the lockout nothing an attacker could not have
    spent on guessing anyway.
    """

    def __init__(
        self,
        limit: int,
        window_seconds: float,
        *,
        max_addresses: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.limit = limit
        self.window_seconds = window_seconds
        self.max_addresses = max_addresses
        self._clock = clock
        # Ordered by each address's newest failure, oldest first.
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._failures)

    def _forget_expired(self, now: float) -> None:
        while self._failures:
            newest_of_oldest = next(iter(self._failures.values()))[-1]
            if newest_of_oldest > now - self.window_seconds:
                return
            self._failures.popitem(last=False)

    def locked(self, address: str) -> bool:
        with self._lock:
            now = self._clock()
            self._forget_expired(now)
            failures = self._failures.get(address, ())
            return len(failures) >= self.limit and failures[0] > now - self.window_seconds

    def failed(self, address: str) -> None:
        with self._lock:
            now = self._clock()
            self._forget_expired(now)
            failures = self._failures.pop(address, None) or deque(maxlen=self.limit)
            failures.append(now)
            self._failures[address] = failures
            while len(self._failures) > self.max_addresses:
                self._failures.popitem(last=False)


# AXES_COOLOFF_TIME is in hours (LOGIN_LOCKOUT_MINUTES / 60).
failures = LoginFailures(settings.AXES_FAILURE_LIMIT, settings.AXES_COOLOFF_TIME * 3600)
_flower_get_current_user = BaseHandler.get_current_user


def _throttled_get_current_user(self):
    address = self.request.remote_ip
    if failures.locked(address):
        raise tornado.web.HTTPError(429, "too many failed logins: try again later")
    try:
        return _flower_get_current_user(self)
    except tornado.web.HTTPError as exc:
        if exc.status_code == 401 and self.request.headers.get("Authorization"):
            failures.failed(address)
        raise


class LoginRequiredMetrics(Metrics):
    @tornado.web.authenticated
    async def get(self):
        await super().get()


def _broker_of_plumbs_url(self):
    # Flower picks its broker client (queue lengths for the Broker page and the queues
    # API) by the scheme of kombu's URI, which for a transport given by path is
    # `jobs.transport:Transport://`: "'redis' broker is not supported". The URL Plumb was
    # configured with has the scheme Flower knows (redis://, or sentinel:// for the first
    # of the sentinels, which finds the master), and the same transport options.
    return Broker(
        settings.CELERY_BROKER_URL.split(";")[0],
        broker_options=self.capp.conf.broker_transport_options,
        broker_use_ssl=self.capp.conf.broker_use_ssl,
    )


BaseHandler.get_current_user = _throttled_get_current_user
BaseHandler.get_broker = _broker_of_plumbs_url
# Flower builds its application from this list when it starts (flower.app.Flower).
urls.handlers[:] = [
    (spec[0], LoginRequiredMetrics, *spec[2:])
    if isinstance(spec, tuple) and spec[1] is Metrics
    else spec
    for spec in urls.handlers
]
