#!/usr/bin/env python
"""A downstream site for throughput benchmarks: asyncio, one process, cheap per request.

    .venv/bin/python -m bench.fast_site --port 8123 --delay 0.2

Every GET answers 200 with the same small HTML page (title, description, canonical,
one h1, internal links) after `--delay` seconds, so the site is never what limits a
benchmark: thousands of slow requests wait at once on one event loop.
`/links/<n>` answers a page with <n> external links to `--link-host`, each answering
after the same delay.
"""

from __future__ import annotations

import argparse
import asyncio
import re

PAGE = (
    "<!doctype html><html lang=en><head><meta charset=utf-8>"
    "<title>Plumb benchmark page</title>"
    '<meta name="description" content="A page the throughput benchmark audits.">'
    '<link rel="canonical" href="/">'
    "</head><body><h1>Benchmark</h1>"
    + "".join(
        f'<p>Paragraph {n} with <a href="/p/{n}">an internal link</a>.</p>' for n in range(40)
    )
    + "</body></html>"
)


def links_page(count: int, link_host: str) -> str:
    anchors = "".join(f'<a href="http://{link_host}/l/{n}">link {n}</a>' for n in range(count))
    return f"<!doctype html><html><head><title>Links</title></head><body>{anchors}</body></html>"


class Site:
    def __init__(self, delay: float, link_host: str):
        self.delay, self.link_host = delay, link_host

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                request_line = head.split(b"\r\n", 1)[0].decode("latin-1")
                path = request_line.split(" ")[1] if " " in request_line else "/"
                if self.delay:
                    await asyncio.sleep(self.delay)
                match = re.fullmatch(r"/links/(\d+)", path)
                body = (links_page(int(match[1]), self.link_host) if match else PAGE).encode()
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\n"
                    b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
                )
                await writer.drain()
                if b"connection: close" in head.lower():
                    break
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    async def serve(self, port: int, hosts: int = 1) -> None:
        # 127.0.0.1 to 127.0.0.<hosts>: as many hosts to the client (each its own per-host
        # cap and connection pool) on one loopback interface.
        addresses = [f"127.0.0.{n}" for n in range(1, hosts + 1)]
        server = await asyncio.start_server(self.handle, addresses, port, backlog=4096)
        async with server:
            await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--delay", type=float, default=0.0, help="seconds before each answer")
    parser.add_argument("--link-host", default="localhost", help="host:port the links point at")
    parser.add_argument(
        "--hosts", type=int, default=1, help="answer on 127.0.0.1 to 127.0.0.<hosts>"
    )
    args = parser.parse_args()
    asyncio.run(Site(args.delay, args.link_host).serve(args.port, args.hosts))


if __name__ == "__main__":
    main()
