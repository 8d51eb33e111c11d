"""Django's PostgreSQL backend, its kept connections checked without a round trip.

With CONN_HEALTH_CHECKS, Django checks a kept connection before its first use in each
request and each task, and PostgreSQL's backend checks it with `SELECT 1`: a round trip
to the server, and its statement, on every submission and every audit. A connection the
server ended (a restart, a failover, `pg_terminate_backend`) is told apart without one:
the server's last words (an error, then the end of the stream) wait unread on its socket.
So the check asks the socket instead. An idle connection with nothing to read is usable;
anything waiting (an asynchronous ParameterStatus, as on a standby's promotion, included)
or a connection not idle costs one reconnection, never a query on a dead connection.
Pooled connections are checked by psycopg_pool (Django hands it `check`), as before.
"""

from __future__ import annotations

import select

import psycopg
from django.db.backends.postgresql import base
from psycopg.pq import TransactionStatus


class DatabaseWrapper(base.DatabaseWrapper):
    def is_usable(self) -> bool:
        connection = self.connection
        if connection is None or connection.closed or connection.broken:
            return False
        if connection.info.transaction_status != TransactionStatus.IDLE:
            return False
        poller = select.poll()
        try:
            poller.register(connection.fileno(), select.POLLIN)
        except (OSError, ValueError, psycopg.Error):
            return False
        # POLLIN, or POLLHUP/POLLERR, which poll reports whether asked or not.
        return not poller.poll(0)
