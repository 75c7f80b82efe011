"""Step functions' modules in a test's ``functions.dir`` (docs/transforms.md “Functions”)."""

from __future__ import annotations

import os
from pathlib import Path


def write_module(path: Path, text: str) -> None:
    """A function's module, with a modification time a changed one is told apart by (within
    the filesystem's granularity too)."""
    before = path.stat().st_mtime if path.exists() else 0.0
    path.write_text(text)
    os.utime(path, (before + 2, before + 2))
