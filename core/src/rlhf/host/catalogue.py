"""Which first-party distribution provides which component name.

Used only for hints: when a name is unknown (e.g. its plugin is not installed or was
blocked), the error says which package to install. The table is the packages' own
registrations, recorded in ``first_party.json`` beside this module by
``python scripts/gen_catalogue.py`` (a test fails when it is stale): the hint is needed
exactly when the package is not installed, so it cannot be read from the package then.
Third-party names are not listed; ``rlhf plugins`` shows what is installed.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources


@cache
def first_party_providers() -> dict[tuple[str, str], str]:
    """``(component kind value, name) -> distribution``, e.g. ``("kl_estimator", "k3") -> "rlhf-plugin-kl"``."""
    table = json.loads(resources.files("rlhf.host").joinpath("first_party.json").read_text())
    return {(kind, name): distribution
            for distribution, kinds in table.items() for kind, names in kinds.items() for name in names}
