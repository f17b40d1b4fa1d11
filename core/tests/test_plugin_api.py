"""The plugin API is stable within one PLUGIN_API_VERSION (docs/plugin-api.md): a public signature
that changes or disappears without a version bump fails here; an addition asks for a new snapshot."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

import rlhf
from rlhf.deprecation import Moved, Removed
from rlhf.testing.api_surface import PUBLIC_MODULES, compare, snapshot_path, snapshots, surface, undeprecated_removals

REGENERATE = "python -m rlhf.testing.api_surface --write"


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


def test_no_public_name_of_any_recorded_api_disappeared_without_a_deprecation() -> None:
    """Across versions too: a name of an older API's snapshot that is gone must have been deprecated first
    (docs/plugin-api.md: an alias that warns for at least one API version, then an entry in REMOVED)."""
    current = surface()
    recorded = snapshots()
    assert rlhf.PLUGIN_API_VERSION in recorded
    for version, old in recorded.items():
        gone = undeprecated_removals(old, current)
        assert not gone, (f"public names of plugin API {version} disappeared without a deprecation: {gone}. Keep them as "
                          "aliases that warn (rlhf.deprecation) for at least one API version before removing them")


def test_every_move_and_removal_is_in_the_changelog() -> None:
    from rlhf.deprecation import MOVED_MODULES, REMOVED

    page = (Path(__file__).resolve().parents[2] / "docs" / "plugin-api.md").read_text()
    table = page[page.index("## Deprecations and removals"):page.index("## Changes")]
    missing = [entry.old for entry in MOVED_MODULES if f"`{entry.old}`" not in table or f"`{entry.new}`" not in table]
    missing += [entry.name for entry in REMOVED if f"`{entry.name}`" not in table]
    assert not missing, f"docs/plugin-api.md's 'Deprecations and removals' table does not list {missing}"


def test_a_removal_without_a_deprecation_is_detected() -> None:
    old = {"rlhf.ops.as_float": "(x)", "rlhf.ops.masked_mean": "(v, m)", "rlhf.moved.Steering": "class(object)",
           "rlhf.moved.Steering.stop": "(self)", "rlhf.moved.gone": "(x)"}
    current = {"rlhf.ops.masked_mean": "(v, m)"}
    moved = [Moved("rlhf.moved", "rlhf.steering", 3, 5)]  # its alias serves what the new module still has
    assert undeprecated_removals(old, current, moved, []) == ["rlhf.moved.gone", "rlhf.ops.as_float"]
    old.pop("rlhf.moved.gone")
    never_deprecated = Removed("rlhf.ops:as_float", rlhf.PLUGIN_API_VERSION, "rlhf.ops.masked_mean")
    assert undeprecated_removals(old, current, moved, [never_deprecated]) == ["rlhf.ops.as_float"]
    after_a_window = Removed("rlhf.ops:as_float", rlhf.PLUGIN_API_VERSION, "rlhf.ops.masked_mean",
                             deprecated_in=rlhf.PLUGIN_API_VERSION - 1)
    assert undeprecated_removals(old, current, moved, [after_a_window]) == []
    assert undeprecated_removals(old, current, [], [after_a_window]) == ["rlhf.moved.Steering", "rlhf.moved.Steering.stop"]


def test_a_changed_signature_is_detected() -> None:
    snapshot = surface()
    edited = dict(snapshot, **{"rlhf.ops.masked_mean": "(values, mask)"})
    del edited["rlhf.ops.as_float"]
    edited["rlhf.ops.new_helper"] = "(x)"
    assert compare(edited, snapshot) == (["rlhf.ops.new_helper"], ["rlhf.ops.masked_mean"], ["rlhf.ops.as_float"])
    assert snapshot["rlhf.components.PolicyLoss.token_level"] == "attribute: ClassVar[bool]"
    assert snapshot["rlhf.registry.ComponentKind.KL_ESTIMATOR"] == "'kl_estimator'"


IMPORT = re.compile(r"^[ \t]*(?:from\s+(rlhf(?:\.\w+)*)\s+import\s+(?:\(([^)]*)\)|([\w \t,]*))|import\s+(rlhf\.[\w.]+))",
                    re.MULTILINE)


def rlhf_modules_imported(source: str) -> set[str]:
    """The rlhf modules a source file imports, at module top or inside functions (``from rlhf import x`` counts
    as ``rlhf.x`` when ``x`` is a module, and as ``rlhf`` when it is a name the package defines)."""
    modules = set()
    for package, bracketed, names, module in IMPORT.findall(source):
        if module:
            modules.add(module)
            continue
        for name in (n.strip() for n in (bracketed or names).split(",")):
            if not name:
                continue
            spec = importlib.util.find_spec(package)
            submodule = f"{package}.{name}"
            is_module = spec is not None and spec.submodule_search_locations and importlib.util.find_spec(submodule)
            modules.add(submodule if is_module else package)
    return modules


def test_first_party_plugins_and_templates_import_only_the_public_api() -> None:
    """What a third party copies (a first-party package's code, or a `rlhf plugin new` template) builds on
    public modules only; a plugin's own tests may use internals to build a run."""
    root = Path(__file__).resolve().parents[2]
    sources = [*root.glob("plugins/*/*/src/**/*.py"), *(root / "plugins/tools/scaffold/src/rlhf_plugin_scaffold/templates").rglob("*.py.tmpl")]
    assert len(sources) > 100
    offending = {f"{path.relative_to(root)}: {module}" for path in sources
                 for module in rlhf_modules_imported(path.read_text()) if module not in PUBLIC_MODULES}
    assert not offending, "non-public rlhf modules (docs/plugin-api.md lists the public ones):\n" + "\n".join(sorted(offending))


def declared_plugin_apis(source: str) -> list[object]:
    """What each module-level ``rlhf_plugin_api = …`` of a source assigns: the int itself, or the expression's text."""
    import ast

    found = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "rlhf_plugin_api" for t in node.targets):
            literal = isinstance(node.value, ast.Constant) and type(node.value.value) is int
            found.append(node.value.value if literal else ast.unparse(node.value))
    return found


def test_first_party_plugins_declare_the_plugin_api_they_need_as_a_number() -> None:
    """``rlhf_plugin_api = rlhf.PLUGIN_API_VERSION`` would claim whatever API the installed core serves, so a copy of
    the plugin would pass the compatibility check on a core too old for it; each plugin names its number."""
    root = Path(__file__).resolve().parents[2]
    sources = [*root.glob("plugins/*/*/src/**/*.py"), *root.glob("core/src/rlhf/**/*.py"), *root.glob("docs/**/*.py")]
    declared = {path.relative_to(root): apis for path in sources if (apis := declared_plugin_apis(path.read_text()))}
    assert len(declared) >= 48, sorted(map(str, declared))
    not_numbers = {str(path): apis for path, apis in declared.items() if not all(type(api) is int for api in apis)}
    assert not not_numbers, f"declare the plugin API as a number (docs/plugin-api.md): {not_numbers}"
    served = range(rlhf.OLDEST_PLUGIN_API, rlhf.PLUGIN_API_VERSION + 1)
    assert all(api in served for apis in declared.values() for api in apis), declared


def test_the_plugin_api_scan_tells_a_number_from_an_expression() -> None:
    source = "import rlhf\nrlhf_plugin_api = 2\n\ndef f():\n    rlhf_plugin_api = 9\n"
    assert declared_plugin_apis(source) == [2]
    assert declared_plugin_apis("import rlhf\nrlhf_plugin_api = rlhf.PLUGIN_API_VERSION\n") == ["rlhf.PLUGIN_API_VERSION"]
    assert declared_plugin_apis("rlhf_plugin_api = True\n") == ["True"]


def test_the_import_scan_sees_every_form_of_import() -> None:
    source = ("import rlhf.runtime.control.controller\nfrom rlhf import ops, hookimpl\n"
              "def f():\n    from rlhf.config.ppo import (\n        PPOConfig,\n    )\n")
    assert rlhf_modules_imported(source) == {"rlhf.runtime.control.controller", "rlhf", "rlhf.ops", "rlhf.config.ppo"}


@pytest.mark.parametrize(("old", "new", "compatible"), [
    ("(self, reason: 'str' = '') -> 'None'", "(self, reason: 'str' = '', *, under: 'str | None' = None) -> 'None'", True),
    ("(a, b=1)", "(a, b=1, c=2)", True),
    ("(a, b=1)", "(a, b=1, c)", False),  # not even valid: a required parameter after a default
    ("(a, b=1)", "(a, c=2, b=1)", False),  # b moved: a positional call would bind c
    ("(a, b=1)", "(a, b=2)", False),  # a changed default
    ("(a, *, k=1)", "(a, *, k=1, j)", False),  # a required keyword
    ("(a) -> int", "(a, b=1) -> str", False),  # another return type
    ("classmethod(cls, x)", "classmethod(cls, x, y=None)", True),
    ("(self, coefficients: 'dict' = <factory>)", "(self, coefficients: 'dict' = <factory>, keep: 'int' = 1)", True),
    # a class that keeps its bases and gains a mixin (the kits' ContractProperties) still serves every subclass
    ("class(ComponentKit)", "class(ContractProperties, ComponentKit)", True),
    ("class(object)", "class(ContractProperties)", True),
    ("class(ComponentKit)", "class(ContractProperties)", False),  # a base dropped
])
def test_only_added_optional_parameters_extend_a_signature(old: str, new: str, compatible: bool) -> None:
    from rlhf.testing.api_surface import compare

    assert compare({"f": old}, {"f": new})[1] == ([] if compatible else ["f"])
