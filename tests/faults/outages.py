"""What the fault tests share: the web as a real gunicorn process, and a TCP proxy that cuts
the workers (or the web) off PostgreSQL. The `db_proxy` fixture is in
tests/faults/conftest.py."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading

import httpx2
from django.db import connection

from config import devservices
from tests.submitting import post_audit
from tests.workers import ROOT, database_url_for_workers, wait_for


class WebProcess:
    def __init__(self, env: dict):
        self.port = devservices.free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "config.wsgi:application", "--bind",
             f"127.0.0.1:{self.port}", "--workers", "1", "--no-control-socket"],
            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            wait_for(self._answers, timeout=30, message="gunicorn to answer")
        except BaseException:
            # The test never gets `web` to stop: a start that timed out (a loaded machine)
            # left gunicorn running after the suite.
            self.stop()
            raise

    def _answers(self) -> bool:
        try:
            return httpx2.get(f"{self.url}/api/schema", timeout=2).status_code == 200
        except httpx2.HTTPError:
            return False

    def submit(self, url: str) -> httpx2.Response:
        return post_audit(self.url, url)

    def stop(self):
        self.process.terminate()
        self.process.wait(timeout=15)


class CuttableProxy:
    """A TCP proxy to the database that can drop every connection and refuse new ones."""

    def __init__(self, target: tuple[str, int]):
        self.target = target
        self.port = devservices.free_port()
        self.listener = socket.create_server(("127.0.0.1", self.port))
        self.open = threading.Event()
        self.open.set()
        self.sockets: list[socket.socket] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if not self.open.is_set():
                client.close()
                continue
            upstream = socket.create_connection(self.target)
            with self.lock:
                self.sockets += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(source, sink):
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def cut(self):
        self.open.clear()
        with self.lock:
            for s in self.sockets:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
            self.sockets.clear()

    def restore(self):
        self.open.set()

    def close(self):
        self.cut()
        self.listener.close()


def via(proxy: CuttableProxy) -> str:
    return database_url_for_workers().replace(
        f":{connection.settings_dict['PORT'] or 5432}/", f":{proxy.port}/"
    )
