"""Run the whole service in the foreground: web, one worker per queue, beat, Flower.

`make run` calls this. A process that exits is restarted with backoff
(devstack.supervisor); Ctrl-C or SIGTERM stops every process it started.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit

import redis
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import BaseCommand, CommandError, call_command

from config import devservices
from config.redis import dedicated_client
from config.secret_files import kept_secret
from devstack.supervisor import AlreadyRunning, Supervisor, die_with_parent


def flower_basic_auth(var_dir: Path, configured: str) -> tuple[str, bool]:
    """Flower's `user:password`: FLOWER_BASIC_AUTH, else one generated once per checkout.

    Kept in var/ (like the dev secret key) so a browser's saved login survives a
    restart. Returns the credentials and whether they were generated.
    """
    if configured:
        return configured, False
    return kept_secret(var_dir / "flower-basic-auth", f"flower:{secrets.token_urlsafe(12)}"), True


def service_secret_key(var_dir: Path, configured: str) -> str:
    """SECRET_KEY of the stack's processes: the configured one, else one generated once per
    checkout and kept in var/ (never the dev key, which DEBUG=false refuses)."""
    if configured and not configured.startswith(settings.DEV_SECRET_KEY_PREFIX):
        return configured
    return kept_secret(var_dir / "secret-key", secrets.token_urlsafe(50))


def stack_environment(environ: Mapping[str, str], var_dir: Path, *, demo: bool) -> dict[str, str]:
    """The environment of every process the stack starts, and of the commands that prepare
    its database (`prepare`): one SECRET_KEY for all of them."""
    env = dict(environ)
    # The service runs as it would in production, DEBUG off: under DEBUG Django keeps
    # and formats every query, which cost a worker a third of its CPU per audit
    # (BENCHMARKS.md, throughput). `manage.py runserver` is there for debugging.
    env["DEBUG"] = "false"
    env["SECRET_KEY"] = service_secret_key(var_dir, environ.get("SECRET_KEY", ""))
    # Plain http on 127.0.0.1: a browser drops a Secure cookie there (only "localhost"
    # counts as a secure context), and the admin login would never stick. A deployment
    # behind TLS keeps the default (secure when DEBUG is off).
    env.setdefault("SECURE_COOKIES", "false")
    if demo:
        env["AUDIT_ALLOW_PRIVATE_TARGETS"] = "true"
    # Flower reads FLOWER_BASIC_AUTH from its environment and refuses anyone without it.
    env["FLOWER_BASIC_AUTH"], _ = flower_basic_auth(var_dir, environ.get("FLOWER_BASIC_AUTH", ""))
    return env


def prepare(env: Mapping[str, str]) -> None:
    """Migrate and collect static files as processes of the stack, in its environment.

    `manage.py runstack` itself runs with DEBUG on and the development key (the Makefile),
    the stack with the key kept in var/. The key that encrypts callback secrets derives from
    SECRET_KEY (audits.secrets), so a migration that encrypts them (audits 0009) run in this
    process wrote rows the web and workers could not read (InvalidToken).
    """
    manage = str(settings.BASE_DIR / "manage.py")
    for command in (["migrate", "--no-input"], ["collectstatic", "--no-input"]):
        subprocess.run([sys.executable, manage, *command, "--verbosity", "0"], env=env, check=True)


def web_command(host: str, port: int, *, workers: int) -> str:
    """gunicorn's ASGI workers: an event loop reads requests, so a client trickling its
    headers holds a socket, not a worker (config/asgi.py; bench/slow_clients.py)."""
    bin_dir = Path(sys.executable).parent
    return (
        f"{bin_dir / 'gunicorn'} config.asgi:application --worker-class asgi"
        f" --bind {host}:{port} --workers {workers}"
        " --access-logfile - --graceful-timeout 10 --no-control-socket"
    )


def stack_commands(demo: bool = False) -> dict[str, str]:
    """The command line of each process `make run` starts, by name (also bench/soak.py's)."""
    bin_dir = Path(sys.executable).parent
    celery = f"{bin_dir / 'celery'} -A config"
    processes = {
        "web": web_command(settings.WEB_HOST, settings.WEB_PORT, workers=settings.WEB_CONCURRENCY),
        # One per core: a threads worker's Python runs on one core at a time (the GIL).
        **{
            f"worker-audits-{n}": (
                f"{celery} worker -Q {settings.AUDIT_QUEUE} -n audits-{n}@%h"
                f" --pool {settings.AUDITS_WORKER_POOL} --concurrency {settings.AUDITS_WORKER_CONCURRENCY} --loglevel INFO"
            )
            for n in range(1, settings.AUDITS_WORKER_PROCESSES + 1)
        },
        "worker-reaudit": (
            f"{celery} worker -Q {settings.REAUDIT_QUEUE} -n reaudit@%h --pool {settings.REAUDIT_WORKER_POOL}"
            f" --concurrency {settings.REAUDIT_WORKER_CONCURRENCY} --loglevel INFO"
        ),
        # Threads: a delivery waits on the network. Its concurrency is
        # WEBHOOK_MAX_CONCURRENCY, applied by the worker itself (config.celery_app).
        "worker-webhooks": (
            f"{celery} worker -Q {settings.WEBHOOK_QUEUE} -n webhooks@%h --pool threads"
            " --loglevel INFO"
        ),
        "beat": f"{celery} beat --loglevel INFO",
        # Flower turns task events on in every worker unless told not to (TASK_EVENTS).
        "flower": (
            f"{celery} flower --conf={settings.BASE_DIR / 'flowerconfig.py'}"
            f" --address=127.0.0.1 --port={settings.FLOWER_PORT}"
            f" --enable_events={settings.TASK_EVENTS}"
        ),
    }
    if demo:
        processes["demo-site"] = (
            f"{sys.executable} -m devstack.demo_site --port {settings.DEMO_SITE_PORT}"
        )
    return processes


class Command(BaseCommand):
    help = "Run web, workers, beat and Flower together (and a local Redis if none answers)."

    def add_arguments(self, parser):
        parser.add_argument(
            "--demo",
            action="store_true",
            help="Also serve the bundled demo site and submit its pages.",
        )

    def handle(self, *args, demo: bool, **options):
        env = stack_environment(os.environ, Path(settings.VAR_DIR), demo=demo)
        generated_flower_login = not settings.FLOWER_BASIC_AUTH
        redis_process = self._ensure_redis()
        try:
            prepare(env)
            self._ensure_admin()
            # The pid file names this run's processes: the next start stops any a lost
            # run left behind, and refuses to start beside a live one.
            supervisor = Supervisor(sys.stdout, pid_file=Path(settings.VAR_DIR) / "stack.pids")
            for name, command in stack_commands(demo).items():
                supervisor.add(name, command, env=env)
            self._print_urls(
                demo, flower_login=env["FLOWER_BASIC_AUTH"] if generated_flower_login else None
            )
            if demo:
                threading.Thread(target=self._submit_demo_pages, daemon=True).start()
            try:
                supervisor.run()
            except AlreadyRunning as exc:
                raise CommandError(str(exc)) from exc
        finally:
            if redis_process is not None:
                redis_process.terminate()
                redis_process.wait(timeout=10)

    def _ensure_redis(self):
        if settings.REDIS_SENTINEL_ADDRESSES:
            self._find_sentinel_master()
            return None
        url = settings.REDIS_URL
        if devservices.redis_answers(url):
            return None
        if not devservices.is_local(url):
            raise CommandError(
                f"REDIS_URL {url} does not answer; start it or point REDIS_URL elsewhere."
            )
        port = urlsplit(url).port or 6379
        self.stdout.write(
            f"No Redis answers at {url}: starting one on 127.0.0.1:{port} for this run."
        )
        # Like the supervisor's programs, it dies with this process, however it ends.
        return devservices.start_redis(
            port, Path(settings.VAR_DIR) / "redis", preexec_fn=die_with_parent(os.getpid())
        )

    def _find_sentinel_master(self) -> None:
        """Under Sentinel, REDIS_URL's host is the master's name, not an address: ask the
        sentinels, as every process of the stack will, and never start a Redis outside
        the group (a stack on it would split from the rest of the deployment)."""
        sentinels = ", ".join(settings.REDIS_SENTINELS)
        name = settings.REDIS_SENTINEL_MASTER
        client = dedicated_client()
        try:
            host, port = client.connection_pool.get_master_address()
            client.ping()
        except (redis.RedisError, OSError) as exc:
            raise CommandError(
                f"The sentinels {sentinels} name no master {name!r} that answers ({exc})."
                " make run starts no Redis of its own under Sentinel: start the group,"
                " or unset REDIS_SENTINELS."
            ) from exc
        finally:
            client.close()
        self.stdout.write(
            f"Redis: master {name!r} at {host}:{port}, from the sentinels {sentinels}."
        )

    def _ensure_admin(self):
        User = get_user_model()
        if User.objects.filter(is_superuser=True).exists():
            return
        password = secrets.token_urlsafe(12)
        User.objects.create_superuser("admin", "admin@localhost", password)
        self.stdout.write(
            self.style.SUCCESS(
                f"Created the admin user. Log in as 'admin' with password '{password}' "
                "(shown once; change it with `manage.py changepassword admin`)."
            )
        )

    def _print_urls(self, demo: bool, flower_login: str | None):
        web = f"http://{settings.WEB_HOST}:{settings.WEB_PORT}"
        flower = f"http://127.0.0.1:{settings.FLOWER_PORT}/"
        if flower_login:
            user, _, password = flower_login.partition(":")
            kept = Path(settings.VAR_DIR) / "flower-basic-auth"
            flower += f" (user {user!r}, password {password!r}, kept in {kept})"
        else:
            flower += " (login from FLOWER_BASIC_AUTH)"
        lines = [
            f"API       {web}/api/audits",
            f"Dashboard {web}/dashboard/ (staff login)",
            f"Metrics   {web}/metrics",
            f"Queue     {web}/api/queue",
            f"Admin     {web}/admin/",
            f"Schema    {web}/api/schema",
            f"Health    {web}/healthz",
            f"Flower    {flower}",
        ]
        if demo:
            lines.append(f"Demo site http://127.0.0.1:{settings.DEMO_SITE_PORT}/")
        lines.append(
            f'Try:      curl -X POST {web}/api/audits -H "Content-Type: application/json" '
            '-d \'{"url": "https://example.org/"}\''
        )
        self.stdout.write("\n".join(lines))

    def _submit_demo_pages(self):
        call_command(
            "demo_submit",
            api=f"http://{settings.WEB_HOST}:{settings.WEB_PORT}",
            site=f"http://127.0.0.1:{settings.DEMO_SITE_PORT}",
        )
