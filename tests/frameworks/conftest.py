from __future__ import annotations

from pathlib import Path

import pytest

from tests.frameworks.tracing import EnvironmentBuildError, own_environment


@pytest.fixture(scope="session")
def openai2_python() -> Path:
    """The Python of the ``openai<3`` frameworks' environment (built before the tests by .ci/run; here only when
    missing, failing with the command to build it when the package index cannot be reached)."""
    try:
        return own_environment()
    except EnvironmentBuildError as error:
        pytest.fail(str(error))
