"""Fixtures shared by the integration tests (the `cluster` fixture itself is in tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration.helpers import cancel_quietly


@pytest.fixture
def jobs(cluster: Any) -> Iterator[list[str]]:
    """The ids a test appends here are cancelled after it, whatever its outcome."""
    submitted: list[str] = []
    yield submitted
    cancel_quietly(cluster, *submitted)
