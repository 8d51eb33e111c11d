"""Secrets generated once per checkout and kept in var/, readable by their owner only.

The development key, the embedded stack's SECRET_KEY and Flower's login live there: a file
another local user can read hands over sessions, signatures and the callback secrets'
encryption key (audits.secrets).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

OWNER_ONLY = 0o600


def kept_secret(path: Path, generated: str) -> str:
    """The secret kept at `path`; `generated` is written there the first time.

    The file is created owner-only (mkstemp opens it 0600: no moment where it is readable
    by others), then linked into place, so a process starting at the same moment reads
    either no file or the whole secret, and the first one kept wins. A file an older
    checkout left readable by others is narrowed to owner-only.
    """
    if path.exists():
        if path.stat().st_mode & 0o777 != OWNER_ONLY:
            path.chmod(OWNER_ONLY)
        return path.read_text().strip()
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, draft = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(descriptor, "w") as file:
            file.write(generated + "\n")
        os.link(draft, path)
    except FileExistsError:
        pass  # another process kept its secret first: that one is read below
    finally:
        os.unlink(draft)
    return path.read_text().strip()
