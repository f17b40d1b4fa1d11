"""An API-1-era agent executor whose component module imports rlhf.engines.hf_models, an internal module that
plugin API 2 removed: the host reads the import before anything is imported and refuses the plugin with one line."""

import rlhf

rlhf_plugin_api = 1


@rlhf.hookimpl
def rlhf_register_agent_executors(register):
    register("legacy_executor", "rlhf_plugin_legacy.executor:LegacyExecutor")
