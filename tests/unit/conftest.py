"""Unit tests start from a process that remembers no secret: the tests run before them in the
same process (a fuzzed connector posted to the API, a running Weir) left theirs in
core/redact.py, which hides each one from everything the process prints from then on."""

from __future__ import annotations

import pytest

from core import redact


@pytest.fixture(autouse=True)
def _no_secret_remembered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(redact, "_SECRETS", redact.Secrets())
