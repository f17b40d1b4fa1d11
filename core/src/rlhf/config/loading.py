"""Build a validated config from ``--config run.yaml``, dotted flags and plugin options.

Precedence: model defaults < YAML file < command-line flags. Every error names the
flag (``--actor.adam.lr``) or the YAML key and file it came from, and says what to do.
"""

from __future__ import annotations

import argparse
import difflib
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from rlhf.config.base import ConfigError, cli_extra, flagged_fields
from rlhf.config.cli_bridge import add_model_flags, flatten, nest, reject_unknown
from rlhf.config.refused import refusals, refuse
from rlhf.errors import OneLineArgumentParser
from rlhf.host.plugin_host import PluginHost
from rlhf.registry import ComponentError, ComponentKind

#: Flags every config-taking command accepts besides the tree itself.
META_DESTS = ("config", "plugins_spec", "strict_plugins", "print_config")


class ConfigParser:
    """The argparse parser of one config model plus the installed plugins' option namespaces."""

    def __init__(self, config_class: type[BaseModel], host: PluginHost, *, prog: str, description: str = "") -> None:
        self.config_class = config_class
        self.host = host
        self.parsed_argv: list[str] = []  # the last command line parsed, as every plugin's rlhf_translate_argv left it
        self.parser = OneLineArgumentParser(
            prog=prog,
            usage=f"{prog} [--config YAML] [--<section>.<field> VALUE ...]",
            description=description,
            allow_abbrev=False, formatter_class=argparse.RawDescriptionHelpFormatter
        )
        meta = self.parser.add_argument_group("run options")
        meta.add_argument("--config", metavar="YAML", help="YAML file holding the same tree; flags override it")
        meta.add_argument("--plugins", dest="plugins_spec", metavar="SPEC", help="plugin selection (see `rlhf --help`)")
        meta.add_argument("--strict-plugins", action="store_true", help="any plugin failure is an error")
        meta.add_argument("--print-config", action="store_true", help="print the resolved config as YAML and exit")
        self.flags = add_model_flags(self.parser, config_class, registry=host.registry, refused=refusals(config_class))
        for namespace, options in sorted(host.options.items()):
            if namespace in config_class.model_fields:
                raise ConfigError(
                    f"plugin {options.plugin!r} declares option namespace {namespace!r}, which is a core config "
                    f"section (--{namespace}.*); the plugin must register its options under another namespace"
                )
            group = self.parser.add_argument_group(f"--{namespace}.*", f"options of plugin {options.plugin}")
            self.flags += add_model_flags(
                self.parser, options.model_class(), prefix=f"{namespace}.", dest_prefix=f"plugins.{namespace}.", group=group
            )

    def known_flags(self) -> list[str]:
        """Every flag this parser takes: the config tree's, the plugins' options and the run options."""
        return [*self.flags, *(s for action in self.parser._actions for s in action.option_strings)]

    def parse(self, argv: list[str], *, refusing: bool = True) -> tuple[BaseModel, argparse.Namespace]:
        """Parse ``argv`` into a validated config; raises :class:`ConfigError` with flag names.
        ``refusing``: a refused option set to a non-default value is an error (see :mod:`rlhf.config.refused`)."""
        command = self.parser.prog.removeprefix("rlhf ")
        self.parsed_argv = self.host.translate_argv(command, argv, self.known_flags(), self.config_class)
        namespace, unknown = self.parser.parse_known_args(self.parsed_argv)
        reject_unknown(unknown, self.flags, self.parser.prog)
        given = {k: v for k, v in vars(namespace).items() if k not in META_DESTS}
        file_tree: dict[str, Any] = {}
        if namespace.config:
            file_tree = read_yaml(namespace.config)
        merged = deep_merge(file_tree, nest(given))
        merged = deep_merge(preset_tree(merged, self.host), merged)
        config = validate(self.config_class, merged, self.host, cli_keys=set(given), source=namespace.config)
        if refusing:
            refuse(config)
        return config, namespace


def preset_tree(tree: dict[str, Any], host: PluginHost) -> dict[str, Any]:
    """The expansion of ``algo.preset`` (if set) as a tree; it ranks below the YAML file and flags."""
    name = (tree.get("algo") or {}).get("preset")
    if not name:
        return {}
    try:
        expansion = host.registry.get(ComponentKind.PRESET, name, flag="--algo.preset")
    except ComponentError as exc:
        raise ConfigError(str(exc)) from None
    return nest(dict(expansion))


def read_yaml(path: str | Path) -> dict[str, Any]:
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"--config {path}: file not found")
    try:
        data = yaml.safe_load(file.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"--config {path}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"--config {path}: the top level must be a mapping of sections, got {type(data).__name__}")
    plugins = data.pop("plugins", None)
    tree = nest(flatten(data))  # accept both nested sections and dotted keys
    if plugins is not None:
        tree["plugins"] = plugins
    return tree


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def validate(
    config_class: type[BaseModel],
    tree: dict[str, Any],
    host: PluginHost,
    *,
    cli_keys: set[str] = frozenset(),  # type: ignore[assignment]
    source: str | None = None,
) -> BaseModel:
    """Validate a config tree, its plugin options and its component names."""
    tree = dict(tree)
    tree["plugins"] = _validate_plugin_options(tree.get("plugins") or {}, host, cli_keys, source)
    try:
        config = config_class.model_validate(tree)
    except ValidationError as exc:
        raise ConfigError(_format_errors(exc, config_class, cli_keys, source)) from None
    check_components(config, host)
    check_plugin_flags(config, host, cli_keys)
    return config


def _validate_plugin_options(raw: Any, host: PluginHost, cli_keys: set[str], source: str | None) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise ConfigError(f"{_where('plugins', cli_keys, source)}: must map plugin namespaces to option mappings")
    validated: dict[str, Any] = {}
    for namespace, values in raw.items():
        options = host.options.get(namespace)
        if options is None:
            known = sorted(host.options)
            close = difflib.get_close_matches(namespace, known, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ConfigError(
                f"{_where(f'plugins.{namespace}', cli_keys, source)}: no loaded plugin declares options under "
                f"{namespace!r}.{hint} Plugin option namespaces: {', '.join(known) or '(none)'}"
            )
        model = options.model_class()
        try:
            validated[namespace] = model.model_validate(values or {}).model_dump(mode="json")
        except ValidationError as exc:
            raise ConfigError(_format_errors(exc, model, cli_keys, source, prefix=f"plugins.{namespace}.")) from None
    for namespace, options in host.options.items():
        if namespace not in validated:
            validated[namespace] = options.model_class()().model_dump(mode="json")
    return validated


def check_components(config: BaseModel, host: PluginHost, prefix: str = "") -> None:
    """Every component-valued field must name a registered component."""
    for name, field in type(config).model_fields.items():
        value = getattr(config, name)
        if isinstance(value, BaseModel):
            check_components(value, host, f"{prefix}{name}.")
            continue
        kind = cli_extra(field).get("component")
        if not kind or value is None:
            continue
        for item in value if isinstance(value, list) else [value]:  # a list field names several
            try:
                host.registry.registration(ComponentKind(kind), item, flag=f"--{prefix}{name}")
            except ComponentError as exc:
                raise ConfigError(str(exc)) from None


def check_plugin_flags(config: BaseModel, host: PluginHost, cli_keys: set[str] = frozenset()) -> None:  # type: ignore[assignment]
    """A flag a plugin implements (:func:`rlhf.config.base.plugin_flag`), set on the command line or away from
    its default, needs that plugin loaded: else a :class:`ConfigError` saying what to install."""

    loaded = {record.name for record in host.loaded()}
    for dotted, plugin, changed in flagged_fields(config):
        if (changed or dotted in cli_keys) and plugin not in loaded:
            raise ConfigError(f"--{dotted} is implemented by the {plugin!r} plugin, which is not loaded: "
                              f"pip install rlhf-plugin-{plugin} (and do not block it with --plugins no:{plugin})")


def _where(dotted: str, cli_keys: set[str], source: str | None) -> str:
    if dotted in cli_keys or source is None:
        return f"--{dotted.removeprefix('plugins.')}"
    return f"{dotted} in {source}"


def _model_at(model: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    for part in loc:
        field = model.model_fields.get(str(part))
        if field is None or not (isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)):
            return None
        model = field.annotation
    return model


def _format_errors(
    exc: ValidationError, model: type[BaseModel], cli_keys: set[str], source: str | None, prefix: str = ""
) -> str:
    lines = []
    for error in exc.errors():
        loc = tuple(error["loc"])
        dotted = prefix + ".".join(str(p) for p in loc)
        where = _where(dotted, cli_keys, source)
        if error["type"] == "extra_forbidden":
            parent = _model_at(model, loc[:-1])
            known = list(parent.model_fields) if parent else []
            close = difflib.get_close_matches(str(loc[-1]), known, n=1)
            hint = f"; did you mean {'.'.join([*(str(p) for p in loc[:-1]), close[0]])}?" if close else ""
            lines.append(f"{where}: unknown option{hint}")
        else:
            lines.append(f"{where}: {error['msg']} (got {error.get('input')!r})")
    return "invalid configuration:\n  " + "\n  ".join(lines)
