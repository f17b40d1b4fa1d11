"""Shared fixtures: third-party fixture plugin packages installed for real with pip."""

from __future__ import annotations

from pathlib import Path

import pytest
from rlhf_test_support import PACKAGES, RlhfCli, pip_install_target


@pytest.fixture(scope="session")
def third_party_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A site dir holding every fixture plugin package, as if pip-installed by a user."""
    target = tmp_path_factory.mktemp("third-party-site")
    pip_install_target(target, *PACKAGES)
    return target


@pytest.fixture(scope="session")
def rlhf_cli(third_party_site: Path) -> RlhfCli:
    return RlhfCli(third_party_site)
