"""rlhf: a plugin-based RLHF framework.

Plugins import only ``rlhf`` (and the stdlib) at module top::

    import rlhf

    rlhf_plugin_api = rlhf.PLUGIN_API_VERSION

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

#: The plugin API this core implements. A plugin module declares the version it
#: targets as ``rlhf_plugin_api = <int>``; the host refuses any other value.
#: Bumped only when a hook or component protocol changes incompatibly.
PLUGIN_API_VERSION = 3

hookimpl = pluggy.HookimplMarker(PROJECT_NAME)
hookspec = pluggy.HookspecMarker(PROJECT_NAME)

__all__ = ["PLUGIN_API_VERSION", "PROJECT_NAME", "__version__", "hookimpl", "hookspec"]
