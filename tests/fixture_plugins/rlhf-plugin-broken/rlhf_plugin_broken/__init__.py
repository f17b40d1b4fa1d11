"""Fails on import, like a plugin whose own dependency is missing."""

import rlhf_dependency_that_is_not_installed  # noqa: F401
