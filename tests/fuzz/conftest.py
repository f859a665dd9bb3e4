"""The world of the fuzz cases, made once per worker."""

from __future__ import annotations

import pytest
from fuzzing import make_world


@pytest.fixture(scope="session")
def world(tmp_path_factory) -> dict:
    return make_world(tmp_path_factory.mktemp("fuzz"))
