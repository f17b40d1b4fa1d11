"""Which plugins this core serves (rlhf.host.compatibility): by the plugin API they need and their rlhf-core
range's lower bound; an upper cap alone only warns (or is refused with --strict-plugins)."""

from __future__ import annotations

from pathlib import Path

import pytest

import rlhf
from rlhf.host.compatibility import PluginFailure, check_api, check_core_range
from rlhf.host.selection import FAILED, INCOMPATIBLE, PluginRecord


def installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, requirement: str) -> PluginRecord:
    """A distribution's metadata on sys.path, depending on ``requirement``: what importlib.metadata reads."""
    name = f"rlhf-plugin-x{abs(hash(requirement))}"
    info = tmp_path / f"{name.replace('-', '_')}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\nRequires-Dist: {requirement}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return PluginRecord("x", "rewards", "entry-point", "x", name, "1.0")


@pytest.mark.parametrize(("requirement", "cap"), [
    ("rlhf-core>=0.3", ""),
    ("rlhf-core>=0.1", ""),
    ("rlhf-core>=0.1,<0.2", "rlhf-core<0.2,>=0.1"),
    ("rlhf-core==0.1.0", "rlhf-core==0.1.0"),
    ("rlhf-core~=0.1.0", "rlhf-core~=0.1.0"),
])
def test_an_upper_cap_is_returned_to_warn_about(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, requirement: str,
                                                cap: str) -> None:
    assert check_core_range(installed(tmp_path, monkeypatch, requirement), refuse_caps=False) == cap


def test_strict_mode_refuses_the_cap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(PluginFailure, match=r"rlhf-core<0.2,>=0.1, which excludes .* --strict-plugins refuses") as caught:
        check_core_range(installed(tmp_path, monkeypatch, "rlhf-core>=0.1,<0.2"), refuse_caps=True)
    assert caught.value.status == INCOMPATIBLE


@pytest.mark.parametrize("requirement", ["rlhf-core>=0.99", "rlhf-core>=0.99,<1", "rlhf-core==0.99.1"])
def test_a_range_above_this_core_is_incompatible(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, requirement: str) -> None:
    with pytest.raises(PluginFailure, match=r"needs rlhf-core.*0\.99.*pip install -U") as caught:
        check_core_range(installed(tmp_path, monkeypatch, requirement), refuse_caps=False)
    assert caught.value.status == INCOMPATIBLE


def test_every_api_of_the_window_is_served() -> None:
    for api in range(rlhf.OLDEST_PLUGIN_API, rlhf.PLUGIN_API_VERSION + 1):
        assert check_api(api, "m") == api
    for declared, status, message in [(rlhf.PLUGIN_API_VERSION + 1, INCOMPATIBLE, "needs plugin API"),
                                      (rlhf.OLDEST_PLUGIN_API - 1, INCOMPATIBLE, "no longer serves"),
                                      (None, FAILED, "declares no plugin API"), ("3", FAILED, "must be an int"),
                                      (True, FAILED, "must be an int")]:
        with pytest.raises(PluginFailure, match=message) as caught:
            check_api(declared, "m")
        assert caught.value.status == status
