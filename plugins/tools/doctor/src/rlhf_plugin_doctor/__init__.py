"""``rlhf doctor``: the environment a run would see, in one report: versions, CUDA and its devices, every
plugin with its compatibility, the code sandbox, a Ray cluster, and the known breakages with their fixes."""

import rlhf

rlhf_plugin_api = 3  # the lowest plugin API this plugin needs (docs/plugin-api.md)


@rlhf.hookimpl
def rlhf_register_commands(register):
    register("doctor", "rlhf_plugin_doctor.command:DoctorCommand",
             description="check this environment: versions, CUDA, plugins, sandbox, Ray; a fix for each problem")
