"""gunicorn's settings wherever Plumb's web runs: `make run`, docker-compose and the
image all start gunicorn in the checkout, where it reads this file.

Django is loaded in the arbiter, before it binds the port (`preload_app`), and the
URLconf with it (`on_starting` runs before the bind): from the first connection the port
accepts, a worker is a fork away from answering. Loaded by each worker after the bind, as
gunicorn does by default, Django kept the first probes of every start waiting seconds in
the listen backlog, and the log recorded each as a 500 once its client had given up
(tests/test_web_start.py).
"""

from django.urls import get_resolver

preload_app = True


def on_starting(server):
    # Django imports the URLconf (every view, the API schema) on the first request.
    get_resolver().url_patterns  # noqa: B018 - importing it is the point
