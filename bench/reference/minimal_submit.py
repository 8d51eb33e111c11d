"""The reference submission view: validate the URL, insert one row, publish one message.

A whole Django project in one module, served by bench/throughput.py with the same
gunicorn command line as Plumb's web process, the application made by
`bench.reference.minimal_submit:application(database, broker, queue)`: `database` a
SQLite file or PostgreSQL URL holding one table, `submission`; `broker` the Redis the
message goes to; `queue` either a queue nobody consumes or `plain`, the plain Celery
reference's (bench/reference/plain_celery.py), which makes the two together a user's
own end to end.
"""

from __future__ import annotations

import json
import uuid

import dj_database_url
import django
from celery import Celery
from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import URLValidator
from django.http import JsonResponse
from django.urls import path

CREATE_TABLE = (
    "CREATE TABLE IF NOT EXISTS submission (id varchar(36) PRIMARY KEY, url varchar(2048))"
)
validate_url = URLValidator(schemes=["http", "https"])


def configure(database: str) -> None:
    settings.configure(
        DEBUG=False,
        SECRET_KEY="reference-only",
        ALLOWED_HOSTS=["*"],
        ROOT_URLCONF=__name__,
        MIDDLEWARE=[],
        INSTALLED_APPS=[],
        DATABASES={"default": dj_database_url.parse(database, conn_max_age=60)},
    )
    django.setup()


def create_table(database: str) -> None:
    configure(database)
    from django.db import connection  # after configure(): the settings name the database

    with connection.cursor() as cursor:
        cursor.execute(CREATE_TABLE)


def application(database: str, broker_url: str, queue: str):
    configure(database)
    from django.core.wsgi import get_wsgi_application
    from django.db import connection

    broker = Celery("reference", broker=broker_url, fixups=[])
    task = "plain.audit" if queue == "plain" else "reference.audit"

    def submit(request):
        try:
            url = json.loads(request.body)["url"]
            validate_url(url)
        except (ValueError, KeyError, TypeError, ValidationError):
            return JsonResponse({"url": ["Enter a valid URL."]}, status=400)
        submission_id = str(uuid.uuid4())
        with connection.cursor() as cursor:
            cursor.execute("INSERT INTO submission (id, url) VALUES (%s, %s)", [submission_id, url])
        broker.send_task(task, args=[url], queue=queue)
        return JsonResponse({"id": submission_id, "url": url}, status=202)

    urlpatterns.append(path("api/audits", submit))
    return get_wsgi_application()


def asgi_application(database: str, broker_url: str, queue: str, threads: int = 1):
    """The same view behind the web line `make run` uses: gunicorn's asgi workers
    handing complete requests to Django's WSGI handler in `threads` threads
    (config.wsgi_threads), as many as Plumb's web runs (WEB_THREADS)."""
    from config.wsgi_threads import WSGIThreads

    return WSGIThreads(application(database, broker_url, queue), threads=threads)


urlpatterns: list = []
