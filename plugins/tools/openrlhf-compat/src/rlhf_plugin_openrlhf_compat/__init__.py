"""OpenRLHF compatibility: older OpenRLHF flag spellings keep working, and ``rlhf config convert``.

* ``rlhf_translate_argv``: before a command's flags are parsed, OpenRLHF's flat <= 0.9 flags
  (``--pretrain``, ``--advantage_estimator``…) and the 0.11 README's own spellings become
  today's dotted flags (tables in :mod:`rlhf_plugin_openrlhf_compat.tables`), with one warning that
  shows the same command line with today's flags. A removed feature is one ``rlhf: error:`` line
  naming what replaced it.
* ``rlhf config convert SCRIPT.sh | -- COMMAND LINE``: every OpenRLHF command of a shell script as
  a dotted ``rlhf`` command line and a YAML config.

This module runs at plugin load and imports nothing heavy.
"""

import rlhf

rlhf_plugin_api = 3  # the lowest plugin API this plugin needs (docs/plugin-api.md)


@rlhf.hookimpl
def rlhf_translate_argv(command, argv, known_flags, config_class):
    from rlhf_plugin_openrlhf_compat.translation import table_for, translate

    table = table_for(command, config_class)
    if not table:
        return None
    prog = f"rlhf {command}"
    translation = translate(argv, table, known=known_flags, prog=prog)
    translation.warn(prog)
    return translation.argv


@rlhf.hookimpl
def rlhf_register_commands(register):
    register("config", "rlhf_plugin_openrlhf_compat.convert:ConfigCommand",
             description="config tools: rlhf config convert SCRIPT.sh | -- OPENRLHF COMMAND (old flags -> dotted flags and YAML)")
