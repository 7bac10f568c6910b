"""The fixtures the tests of `dra_gpu.kube` share."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from http_api_server import ApiServer


@pytest.fixture
def server() -> Iterator[ApiServer]:
    """An API server over HTTP that serves what a test tells it to, closed after the test."""
    s = ApiServer()
    yield s
    s.close()
