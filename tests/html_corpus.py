"""Real pages to audit, fetched at test time, never committed: the 30 HTML pages in the
newspaper4k 0.9.6 sdist's tests/data/html (MIT; Arabic, Burmese, Chinese, Japanese,
Korean, Latvian, Thai, Spanish, English news sites).

`pip download` fetches the sdist once per machine into the user's cache
(`$XDG_CACHE_HOME/plumb/html-corpus`, by default `~/.cache/plumb/html-corpus`), so a fresh
clone does not download it again. pip prepares an sdist's metadata in an isolated build
environment; only newspaper4k is taken as source (`--no-binary newspaper4k`), so its build
backend comes as a wheel: about 6 s with an empty pip cache, where `--no-binary :all:`
built hatchling from source too (80 s of CPU, and 184 s of a CI run on a new 2-core
machine, 2026-12-07). Its sha256 is checked against the pin on every read, and the pages
are read straight from the tarball.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tarfile
from pathlib import Path

SDIST = "newspaper4k-0.9.6.tar.gz"
SDIST_SHA256 = "a3f2f0e017dddb6f1019ee77aaa8980e13e6ecea0b949abc7167aae4770d2d0e"
PAGES_DIR = "newspaper4k-0.9.6/tests/data/html/"
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "plumb" / "html-corpus"


class CorpusUnavailable(RuntimeError):
    """The sdist could not be downloaded (no network): the caller skips, saying so."""


def corpus_pages() -> dict[str, bytes]:
    """{file name: body bytes} of the corpus's pages, downloading the sdist once."""
    sdist = CACHE / SDIST
    if not sdist.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        download = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", "newspaper4k",
             "--dest", str(CACHE), "newspaper4k==0.9.6"],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        if download.returncode != 0 or not sdist.exists():
            raise CorpusUnavailable(
                f"pip download newspaper4k==0.9.6 failed: {download.stderr.strip()[-500:]}"
            )
    digest = hashlib.sha256(sdist.read_bytes()).hexdigest()
    if digest != SDIST_SHA256:
        sdist.unlink()
        raise AssertionError(f"{SDIST} has sha256 {digest}, not the pinned {SDIST_SHA256}")
    pages = {}
    with tarfile.open(sdist) as archive:
        for member in archive.getmembers():
            if member.isfile() and member.name.startswith(PAGES_DIR):
                pages[member.name[len(PAGES_DIR) :]] = archive.extractfile(member).read()
    return pages
