"""Fixtures of the connector-specific tests."""

from __future__ import annotations
