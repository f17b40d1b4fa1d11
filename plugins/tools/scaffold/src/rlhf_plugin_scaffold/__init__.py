"""``rlhf plugin new KIND NAME``: write a ready plugin package for any component kind.

The package holds its entry point, a component skeleton that passes the kind's conformance kit,
a test using that kit and a README; ``pip install -e`` and ``pytest`` accept it as written.

This module runs at plugin load and only registers the command lazily.
"""

import rlhf

rlhf_plugin_api = 3  # the lowest plugin API this plugin needs (docs/plugin-api.md)


@rlhf.hookimpl
def rlhf_register_commands(register):
    register("plugin", "rlhf_plugin_scaffold.command:PluginCommand",
             description="plugin authoring: rlhf plugin new KIND NAME")
