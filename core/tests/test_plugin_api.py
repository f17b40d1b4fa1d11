"""The plugin API is stable within one PLUGIN_API_VERSION (docs/plugin-api.md): a public signature
that changes or disappears without a version bump fails here; an addition asks for a new snapshot."""

from __future__ import annotations

import json

import rlhf
from rlhf.plugin_api import compare, snapshot_path, surface

REGENERATE = "python -m rlhf.plugin_api --write"


def test_public_signatures_match_the_snapshot_of_this_plugin_api_version() -> None:
    path = snapshot_path(rlhf.PLUGIN_API_VERSION)
    assert path.is_file(), (f"PLUGIN_API_VERSION is {rlhf.PLUGIN_API_VERSION} but {path.name} does not exist: "
                            f"record the new API with `{REGENERATE}` and list the breaking changes in docs/plugin-api.md")
    snapshot = json.loads(path.read_text())
    assert snapshot["plugin_api_version"] == rlhf.PLUGIN_API_VERSION
    removed, changed, added = compare(snapshot["surface"], surface())
    assert not (removed or changed), (
        f"public plugin API changed without a PLUGIN_API_VERSION bump: removed {removed}, changed {changed}. "
        f"Restore them, or bump rlhf.PLUGIN_API_VERSION (every plugin must then be updated) and run `{REGENERATE}`")
    assert not added, f"new public names {added}: additions need no bump; record them with `{REGENERATE}`"


def test_a_changed_signature_is_detected() -> None:
    snapshot = surface()
    edited = dict(snapshot, **{"rlhf.ops.masked_mean": "(values, mask)"})
    del edited["rlhf.ops.as_float"]
    edited["rlhf.ops.new_helper"] = "(x)"
    assert compare(edited, snapshot) == (["rlhf.ops.new_helper"], ["rlhf.ops.masked_mean"], ["rlhf.ops.as_float"])
    assert snapshot["rlhf.components.PolicyLoss.token_level"] == "attribute: ClassVar[bool]"
    assert snapshot["rlhf.registry.ComponentKind.KL_ESTIMATOR"] == "'kl_estimator'"
