"""rlhf: a plugin-based RLHF framework.

Plugins import only ``rlhf`` (and the stdlib) at module top::

    import rlhf

    rlhf_plugin_api = 3  # the lowest plugin API this plugin needs

    @rlhf.hookimpl
    def rlhf_register_advantage_estimators(register):
        register("my_estimator", "my_pkg.estimator:MyEstimator")

This module stays import-light on purpose: ``rlhf --help`` and ``rlhf plugins``
must start without torch.
"""

from __future__ import annotations

import pluggy

__version__ = "0.3.0"

#: pluggy project name; hook implementations are marked with :data:`hookimpl`.
PROJECT_NAME = "rlhf"

#: The plugin API this core implements (the newest it serves). A plugin module declares the lowest API
#: it needs as ``rlhf_plugin_api = <int>``. Bumped only when a hook or component protocol changes
#: incompatibly; from rlhf-core 0.3 on, the core's minor version is this number.
PLUGIN_API_VERSION = 3

#: The oldest plugin API this core still serves: a plugin declaring any API from here to
#: :data:`PLUGIN_API_VERSION` loads (docs/plugin-api.md, "How long a name lives").
OLDEST_PLUGIN_API = 1

hookimpl = pluggy.HookimplMarker(PROJECT_NAME)
hookspec = pluggy.HookspecMarker(PROJECT_NAME)

from rlhf import deprecation as _deprecation  # noqa: E402 - after the constants it reads

_deprecation.install()  # old import paths of moved modules keep working, with a warning

__all__ = ["OLDEST_PLUGIN_API", "PLUGIN_API_VERSION", "PROJECT_NAME", "__version__", "hookimpl", "hookspec"]
