#!/usr/bin/env python
"""Plumb's SEO findings against Lighthouse 12.2.3's verdicts, per (page, check) (issue 34.2).

    .venv/bin/python bench/lighthouse_agreement.py [--jobs 2] [--only SUBSTRING]

Pages: the 30 of the newspaper4k 0.9.6 sdist's tests/data/html (tests/html_corpus.py
downloads it with pip), served as text/html with no charset, and the edge-case pages of
bench/lighthouse_pages.py, each from 127.0.0.1 on fixed ports (one site per robots.txt
variant). Lighthouse (`npm i -E lighthouse@12.2.3` into var/lighthouse when missing)
runs with Debian's chromium (`/usr/bin/chromium`), `--only-categories=seo
--ignore-status-code`; its reports are kept in var/lighthouse/reports keyed by what was
served, so a second run only re-runs Plumb. Plumb's side fetches the same URLs with httpx2
and runs `audit_result` with the site's robots.txt.

Then the CPU the findings add per audit on the 30 corpus pages: the analysis as main had
it (the streaming lxml pass alone) against today's (depth pass, the tree, fields and
findings), and the findings alone on a built tree; process CPU time, best of 5.
"""

from __future__ import annotations

import argparse
import hashlib
import http.server
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
CACHE = ROOT / "var" / "lighthouse"
LIGHTHOUSE_VERSION = "12.2.3"
LIGHTHOUSE = CACHE / "node_modules" / ".bin" / "lighthouse"
CHROME = shutil.which("chromium") or "/usr/bin/chromium"
# Fixed ports: a page's absolute URLs (its canonical) are part of what Lighthouse saw.
PORTS = {"corpus": 38470, "main": 38471, "errors": 38472, "missing": 38473, "down": 38474}
VERDICTS = {"pass": "pass", "fail": "fail", "na": "not_applicable"}


def install_lighthouse() -> None:
    if LIGHTHOUSE.exists():
        return
    CACHE.mkdir(parents=True, exist_ok=True)
    print(f"installing lighthouse@{LIGHTHOUSE_VERSION} into {CACHE}", flush=True)
    subprocess.run(
        ["npm", "install", "--no-audit", "--no-fund", "--prefix", str(CACHE), "-E",
         f"lighthouse@{LIGHTHOUSE_VERSION}"],
        check=True,
    )  # fmt: skip


class Site(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, name: str, pages: dict, robots: tuple[int, str] | None):
        self.name = name
        self.pages = pages  # path -> (body bytes, status, headers)
        self.robots = robots
        super().__init__(("127.0.0.1", PORTS[name]), SiteHandler)

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{PORTS[self.name]}"


class ServedElsewhere:
    """A site whose port another run of this bench already serves (same pages)."""

    def __init__(self, name: str, pages: dict, robots: tuple[int, str] | None):
        self.name, self.pages, self.robots = name, pages, robots
        self.origin = f"http://127.0.0.1:{PORTS[name]}"

    def serve_forever(self):
        pass


def site(name: str, pages: dict, robots: tuple[int, str] | None):
    try:
        return Site(name, pages, robots)
    except OSError:  # in use: a running bench serves it (a --cached-only look meanwhile)
        return ServedElsewhere(name, pages, robots)


class SiteHandler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server's name)
        path = self.path.split("?")[0]
        if path == "/robots.txt" and self.server.robots is not None:
            status, text = self.server.robots
            body, headers, content_type = text.encode(), [], "text/plain"
        elif path in self.server.pages:
            body, status, headers = self.server.pages[path]
            content_type = "text/html"  # no charset, as many servers send pages
        else:
            body, status, headers, content_type = b"not found", 404, [], "text/plain"
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def build_sites() -> list[Site]:
    from bench.lighthouse_pages import PAGES, ROBOTS
    from tests.html_corpus import corpus_pages

    corpus = {f"/{name}": (body, 200, []) for name, body in corpus_pages().items()}
    sites = [site("corpus", corpus, (404, "not found"))]
    for name, robots in ROBOTS.items():
        origin = f"http://127.0.0.1:{PORTS[name]}"
        pages = {
            path: (html.replace("{origin}", origin).encode(), status, headers)
            for (site, path), (html, status, headers) in PAGES.items()
            if site == name
        }
        sites.append(site(name, pages, robots))
    for each in sites:
        threading.Thread(target=each.serve_forever, daemon=True).start()
    return sites


def served_key(site: Site, path: str) -> str:
    body, status, headers = site.pages[path]
    digest = hashlib.sha256()
    for part in (LIGHTHOUSE_VERSION, site.origin, path, str(status), repr(headers),
                 repr(site.robots), body):  # fmt: skip
        digest.update(part if isinstance(part, bytes) else part.encode())
    return digest.hexdigest()[:24]


def lighthouse_verdicts(site: Site, path: str, *, run: bool = True) -> dict[str, str] | str:
    """{check: pass|fail|not_applicable} from Lighthouse, or the run's error."""
    report_path = CACHE / "reports" / f"{served_key(site, path)}.json"
    if not report_path.exists() and not run:
        return "not run (--cached-only)"
    if not report_path.exists():
        report_path.parent.mkdir(parents=True, exist_ok=True)
        run = subprocess.run(
            [str(LIGHTHOUSE), site.origin + path, "--only-categories=seo", "--output=json",
             f"--output-path={report_path}.tmp", "--quiet", "--ignore-status-code",
             "--chrome-flags=--headless=new --no-sandbox"],
            env=dict(os.environ, CHROME_PATH=CHROME), capture_output=True, text=True,
            timeout=300,
        )  # fmt: skip
        if run.returncode != 0:
            error = (run.stderr.strip().splitlines() or [f"exit {run.returncode}"])[-1]
            report_path.write_text(json.dumps({"runtimeError": error[:300]}))
        else:
            os.replace(f"{report_path}.tmp", report_path)
    report = json.loads(report_path.read_text())
    if "categories" not in report:
        return report.get("runtimeError") or "no report"
    if report.get("finalDisplayedUrl") != site.origin + path:
        # A script or meta refresh took Chrome elsewhere: Lighthouse audited another page.
        return f"Lighthouse audited {report.get('finalDisplayedUrl')} instead (a redirect)"
    verdicts = {}
    for ref in report["categories"]["seo"]["auditRefs"]:
        audit = report["audits"][ref["id"]]
        mode = audit["scoreDisplayMode"]
        if mode == "notApplicable":
            verdicts[ref["id"]] = "not_applicable"
        elif mode in ("binary", "numeric"):
            verdicts[ref["id"]] = "pass" if audit["score"] == 1 else "fail"
        elif mode == "error":
            verdicts[ref["id"]] = "error"
    return verdicts


def plumb_findings(site: Site, path: str) -> dict[str, dict]:
    import httpx2

    from audits.analysis import audit_result
    from outbound.integrations.page import FetchedPage
    from outbound.integrations.robots import RULES, RobotsInfo, availability_of

    url = site.origin + path
    response = httpx2.get(url)
    robots_response = httpx2.get(site.origin + "/robots.txt")
    status = robots_response.status_code
    availability = availability_of(status)
    robots = RobotsInfo(
        f"{site.origin}/robots.txt", status,
        robots_response.text if availability == RULES else "", availability,
    )  # fmt: skip
    page = FetchedPage(
        requested_url=url, final_url=url, status_code=response.status_code,
        headers=response.headers, body=response.content, truncated=False, ttfb_ms=0.0,
        total_ms=0.0,
    )  # fmt: skip
    return {item["id"]: item for item in audit_result(page, robots=robots)["findings"]}


def agreement(jobs: int, only: str | None, cached_only: bool = False) -> None:
    from audits.findings import LIGHTHOUSE_CHECK_IDS

    install_lighthouse()
    sites = build_sites()
    targets = [
        (site, path)
        for site in sites
        for path in sorted(site.pages)
        if only is None or only in site.origin + path
    ]
    print(f"{len(targets)} pages; Lighthouse {LIGHTHOUSE_VERSION}, chromium {chromium_version()}",
          flush=True)  # fmt: skip
    started = time.monotonic()
    with ThreadPoolExecutor(jobs) as pool:
        theirs = list(
            pool.map(lambda target: lighthouse_verdicts(*target, run=not cached_only), targets)
        )
    print(f"Lighthouse: {time.monotonic() - started:.0f} s", flush=True)
    pairs = agreed = 0
    disagreements, errors = [], []
    by_check = {check: [0, 0] for check in LIGHTHOUSE_CHECK_IDS}
    for (site, path), lighthouse in zip(targets, theirs, strict=True):
        name = f"{site.name}{path}"
        if isinstance(lighthouse, str):
            errors.append((name, lighthouse))
            continue
        ours = plumb_findings(site, path)
        for check in LIGHTHOUSE_CHECK_IDS:
            if lighthouse.get(check) in (None, "error"):
                errors.append((f"{name} {check}", "Lighthouse audit error"))
                continue
            pairs += 1
            by_check[check][1] += 1
            if ours[check]["outcome"] == lighthouse[check]:
                agreed += 1
                by_check[check][0] += 1
            else:
                disagreements.append((name, check, lighthouse[check], ours[check]))
    print(f"\n### Agreement with Lighthouse {LIGHTHOUSE_VERSION}: {agreed}/{pairs} "
          f"(page, check) pairs = {agreed / max(pairs, 1):.2%}")  # fmt: skip
    print("| check | agree | pairs |\n| --- | --- | --- |")
    for check, (ok, total) in by_check.items():
        print(f"| {check} | {ok} | {total} |")
    print("\nDisagreements (page, check, Lighthouse, Plumb, Plumb's details):")
    for name, check, theirs_verdict, ours in disagreements:
        details = json.dumps(ours["details"], ensure_ascii=False)[:240]
        print(f"- {name} {check}: Lighthouse {theirs_verdict}, Plumb {ours['outcome']} {details}")
    print("\nPages or audits Lighthouse could not run (not counted):")
    for name, error in errors:
        print(f"- {name}: {error}")


def chromium_version() -> str:
    try:
        return subprocess.run([CHROME, "--version"], capture_output=True, text=True,
                              timeout=30).stdout.strip()  # fmt: skip
    except OSError:
        return "missing"


def cpu_cost() -> None:
    """CPU per audit on the corpus: main's analysis against today's, best of 5."""
    from django.conf import settings
    from selectolax.lexbor import LexborHTMLParser

    from audits.analysis import (
        PageReader,
        _stream,
        analyze_html,
        decoded_chunks,
        sniff_encoding,
    )
    from audits.findings import PageInfo, page_findings
    from outbound.integrations.robots import RULES, RobotsInfo
    from tests.html_corpus import corpus_pages

    pages = corpus_pages()
    robots = RobotsInfo(
        "https://corpus.test/robots.txt", 200, "User-agent: *\nDisallow: /private\n", RULES
    )

    def main_analysis(body: bytes, url: str) -> None:  # the streaming pass alone, as on main
        sniffed = sniff_encoding(body)
        reader = PageReader(page_url=url, max_links=settings.AUDIT_MAX_LINKS)
        _stream(list(decoded_chunks(body, sniffed)), reader)
        reader.fields()

    def today(body: bytes, url: str) -> None:
        analyze_html(body, base_url=url, page=PageInfo(url, 200, []), robots=robots)

    def best_cpu(function, body: bytes, url: str) -> float:
        times = []
        for _ in range(5):
            started = time.process_time()
            function(body, url)
            times.append(time.process_time() - started)
        return min(times)

    rows = []
    for name, body in sorted(pages.items()):
        url = f"https://corpus.test/{name}"
        text = "".join(decoded_chunks(body, sniff_encoding(body)))
        tree = LexborHTMLParser(text, scripting=True)
        findings_only = best_cpu(
            lambda _b, u, tree=tree: page_findings(tree, PageInfo(u, 200, []), robots), body, url
        )
        rows.append((name, len(body), best_cpu(main_analysis, body, url),
                     best_cpu(today, body, url), findings_only))  # fmt: skip
    added = [(today - main) * 1000 for _, _, main, today, _ in rows]
    findings = [f * 1000 for *_, f in rows]
    print("\n### CPU per audit on the 30 corpus pages (ms, best of 5)")
    print("| page | bytes | main's analysis | today's analysis | added | findings alone |")
    print("| --- | --- | --- | --- | --- | --- |")
    for (name, size, main, today, only), extra in zip(rows, added, strict=True):
        print(f"| {name} | {size:,} | {main * 1000:.2f} | {today * 1000:.2f} | {extra:+.2f} | "
              f"{only * 1000:.2f} |")  # fmt: skip
    print(f"added: median {statistics.median(added):+.2f} ms, mean {statistics.mean(added):+.2f} ms,"
          f" max {max(added):+.2f} ms; findings alone: median {statistics.median(findings):.2f} ms,"
          f" mean {statistics.mean(findings):.2f} ms, max {max(findings):.2f} ms")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2, help="Lighthouse runs at once")
    parser.add_argument("--only", help="only pages whose URL contains this")
    parser.add_argument("--skip-cpu", action="store_true")
    parser.add_argument(
        "--cached-only",
        action="store_true",
        help="compare only pages whose Lighthouse report is cached",
    )
    args = parser.parse_args()
    os.environ.setdefault("DEBUG", "true")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    agreement(args.jobs, args.only, args.cached_only)
    if not args.skip_cpu:
        cpu_cost()
    return 0


if __name__ == "__main__":
    sys.exit(main())
