"""Fixtures of the sources' tests."""

import jaxtyping
import pytest


@pytest.fixture
def without_annotation_checks():
    """What users get: the test suite type-checks annotations (jaxtyping + beartype, a TypeError on a float
    where an int is annotated), an installed package does not and must raise the ValueError itself."""
    jaxtyping.config.update("jaxtyping_disable", True)
    yield
    jaxtyping.config.update("jaxtyping_disable", False)
