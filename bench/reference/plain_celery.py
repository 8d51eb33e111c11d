"""The reference a user's own twenty lines of Celery would be: fetch and parse, nothing else.

Redis broker, acks late, prefetch 1, results ignored; started by bench/throughput.py as
`celery -A bench.reference.plain_celery -b <redis> worker --pool prefork --concurrency 4`. Each
finished task adds one to a Redis counter, which the benchmark polls.
"""

from __future__ import annotations

import urllib.request
from html.parser import HTMLParser

import redis
from celery import Celery
from celery.signals import worker_process_init

DONE_KEY = "plain:done"

# No Django fixup: the reference is plain Celery, whatever the environment says.
# The broker is the worker's `-b` option, and app.conf.broker_url for the benchmark's publishing.
app = Celery("plain", fixups=[])
app.conf.update(
    task_acks_late=True,
    worker_prefetch_multiplier=1,
    task_ignore_result=True,
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
)
counter: redis.Redis | None = None


@worker_process_init.connect
def connect(**_):
    global counter
    counter = redis.Redis.from_url(app.conf.broker_url)


class TitleParser(HTMLParser):
    def __init__(self):
        super().__init__()
        self.in_title, self.title, self.links = False, "", 0

    def handle_starttag(self, tag, attrs):
        self.in_title = tag == "title"
        self.links += tag == "a"

    def handle_data(self, data):
        if self.in_title:
            self.title += data

    def handle_endtag(self, tag):
        self.in_title = False


def fetch_and_parse(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        body = response.read()
    parser = TitleParser()
    parser.feed(body.decode("utf-8", "replace"))
    return parser.title


@app.task(name="plain.audit")
def audit(url: str) -> None:
    fetch_and_parse(url)
    counter.incr(DONE_KEY)
