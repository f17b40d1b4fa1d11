"""``rlhf plugin new KIND NAME``: a ready plugin package from the templates shipped with this plugin.

The package it writes (``rlhf-plugin-<name>/``) holds a ``pyproject.toml`` with the entry point
and the lowest rlhf-core it needs (no upper cap), the hook module, a component skeleton that passes its
conformance kit, a test file using the kit, and a README. ``pip install -e`` and ``pytest``
accept it as written. The templates live in ``rlhf_plugin_scaffold/templates/plugin`` (package data):
``common/`` for every kind and one folder per kind, whose files override the common ones.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from rlhf import PLUGIN_API_VERSION, __version__
from rlhf.errors import ConfigError
from rlhf.registry import ComponentKind

NAME_PATTERN = re.compile(r"[a-z][a-z0-9_]*")
#: a distribution name (PEP 508) whose import package, - and . read as _, is a Python identifier
DISTRIBUTION_PATTERN = re.compile(r"[A-Za-z][A-Za-z0-9._-]*[A-Za-z0-9]|[A-Za-z]")
#: the prefix of a first-party-style distribution name, left out of the plugin's name (--plugins no:NAME)
DISTRIBUTION_PREFIX = "rlhf-plugin-"


@dataclass(frozen=True)
class TemplateKind:
    """One ``KIND`` of ``rlhf plugin new``: what it registers, where it is discovered, which kit tests it."""

    name: str
    component: ComponentKind | None  # None: a lifecycle observer (hooks, no component)
    module: str  # the component module's file stem
    kit: str  # the rlhf.testing.conformance class its test subclasses
    suffix: str  # appended to the CamelCase name to name the component class
    doc: str  # its page under docs/plugins/
    select: str  # how a run uses it, with {name}; shown in the README
    libraries: tuple[str, ...] = ()  # rlhf libraries its code builds on, added to the package's dependencies

    @property
    def group(self) -> str:
        """The entry-point group suffix (``rlhf.<group>``): the plugin kind of what it registers."""
        return self.component.plugin_kind if self.component is not None else "algorithms"


KINDS: dict[str, TemplateKind] = {k.name: k for k in (
    TemplateKind("advantage-estimator", ComponentKind.ADVANTAGE_ESTIMATOR, "estimator", "AdvantageEstimatorKit",
                 "Estimator", "advantage-estimator.md", "rlhf train ppo --algo.advantage.estimator {name} --rollout.n_samples_per_prompt 4 …"),
    TemplateKind("policy-loss", ComponentKind.POLICY_LOSS, "loss", "PolicyLossKit", "Loss", "policy-loss.md", "rlhf train ppo --actor.policy_loss_type {name} …"),
    TemplateKind("kl-estimator", ComponentKind.KL_ESTIMATOR, "kl", "KLEstimatorKit", "KL", "kl-estimator.md", "rlhf train ppo --algo.kl.estimator {name} --algo.kl.init_coef 0.01 …"),
    TemplateKind("reward-function", ComponentKind.REWARD_FUNCTION, "reward", "RewardFunctionKit", "Reward",
                 "reward-function.md", "rlhf train ppo --reward.functions {name} --data.label_key label …"),
    TemplateKind("reward-shaper", ComponentKind.REWARD_SHAPER, "shaper", "RewardShaperKit", "Shaper",
                 "reward-shaper.md", "rlhf train ppo --{name}.per_token 0.01 …   (every installed shaper is built; it runs when its option is set)"),
    TemplateKind("sample-filter", ComponentKind.SAMPLE_FILTER, "sample_filter", "SampleFilterKit", "Filter",
                 "sample-filter.md", "registered; the PPO loop selects filters by their own flags (see docs/plugins/sample-filter.md)"),
    TemplateKind("agent-executor", ComponentKind.AGENT_EXECUTOR, "executor", "AgentExecutorKit", "Executor",
                 "agent-executor.md", "registered; see docs/plugins/agent-executor.md for how the PPO loop picks its executor"),
    TemplateKind("agent-environment", ComponentKind.AGENT_EXECUTOR, "environment", "AgentExecutorKit", "Executor",
                 "agent-environment.md", "rlhf train ppo --train.agent_executor {name} --data.label_key label …",
                 ("rlhf-agents",)),
    TemplateKind("trainer", ComponentKind.TRAINER, "trainer", "TrainerKit", "Trainer", "trainer.md", "rlhf train {name} --message hello"),
    TemplateKind("command", ComponentKind.COMMAND, "command", "CommandKit", "Command", "command.md", "rlhf {name} --who you"),
    TemplateKind("optimizer", ComponentKind.OPTIMIZER, "optimizer", "OptimizerKit", "Optimizer", "optimizer.md", "rlhf train ppo --actor.optim {name} --critic.optim {name} …"),
    TemplateKind("scheduler", ComponentKind.SCHEDULER, "scheduler", "SchedulerKit", "Scheduler", "scheduler.md", "rlhf train ppo --actor.lr_scheduler {name} --critic.lr_scheduler {name} …"),
    TemplateKind("model-loader", ComponentKind.MODEL_LOADER, "loader", "ModelLoaderKit", "Loader", "model-loader.md", "registered; see docs/plugins/model-loader.md"),
    TemplateKind("prompt-source", ComponentKind.PROMPT_SOURCE, "source", "PromptSourceKit", "Source", "prompt-source.md",
                 "rlhf train ppo --data.prompt_source {name} --data.label_key label …"),
    TemplateKind("processor", ComponentKind.PROCESSOR, "processor", "ProcessorKit", "Processor", "processor.md", "registered; see docs/plugins/processor.md"),
    TemplateKind("rollout-engine", ComponentKind.ROLLOUT_ENGINE, "engine", "RolloutEngineKit", "Engine",
                 "rollout-engine.md", "rlhf train ppo --rollout.engine {name} …"),
    TemplateKind("weight-sync-transport", ComponentKind.WEIGHT_SYNC_TRANSPORT, "transport", "WeightSyncTransportKit",
                 "Transport", "weight-sync-transport.md", "rlhf train ppo --vllm.sync_backend {name} …"),
    TemplateKind("training-backend", ComponentKind.TRAINING_BACKEND, "backend", "TrainingBackendKit",
                 "Backend", "training-backend.md", "rlhf train ppo --train.backend {name} …   (and rlhf train sft|rm|dpo …)"),
    TemplateKind("rollout-scheduler", ComponentKind.ROLLOUT_SCHEDULER, "rollout_scheduler", "RolloutSchedulerKit",
                 "RolloutScheduler", "rollout-scheduler.md", "rlhf train ppo --train.rollout_scheduler {name} …"),
    TemplateKind("reward-manager", ComponentKind.REWARD_MANAGER, "manager", "RewardManagerKit", "Manager",
                 "reward-manager.md", "rlhf train ppo --reward.manager {name} --{name}.functions math_answer,format --data.label_key label …"),
    TemplateKind("rollout-correction", ComponentKind.ROLLOUT_CORRECTION, "correction", "RolloutCorrectionKit", "Correction",
                 "rollout-correction.md", "rlhf train ppo --{name}.max_weight 2.0 …   (every installed correction is built; it applies when its option is set)"),
    TemplateKind("observer", None, "observer", "LifecycleObserverKit", "Observer", "observer.md", "every run calls its hooks once it is installed (rlhf --plugins no:{plugin} … leaves it out)"),
)}


def template_kind(kind: str) -> TemplateKind:
    key = kind.replace("_", "-")
    if key not in KINDS:
        raise ConfigError(f"rlhf plugin new: unknown kind {kind!r}; choose one of {', '.join(KINDS)}")
    return KINDS[key]


def check_name(name: str) -> str:
    if not NAME_PATTERN.fullmatch(name):
        raise ConfigError(f"rlhf plugin new: name {name!r} must be lower case letters, digits and underscores, "
                          "starting with a letter (it names the component, the flag namespace and the package)")
    return name


@dataclass(frozen=True)
class Distribution:
    """The names of a new plugin package: its distribution (``pip install``), its import package and the plugin's
    name (its entry point: ``--plugins no:NAME``, ``rlhf plugins``)."""

    name: str
    package: str
    plugin: str

    @classmethod
    def of(cls, component: str, distribution: str | None = None) -> Distribution:
        """``rlhf-plugin-<component>`` by default; a chosen ``distribution`` (``rlhf-plugin-staticcache``,
        ``acme-rollout``) names the package after it (``rlhf_plugin_staticcache``) and the plugin after it less its
        ``rlhf-plugin-`` prefix (``staticcache``)."""
        if distribution is None:
            return cls(f"{DISTRIBUTION_PREFIX}{component.replace('_', '-')}", f"rlhf_plugin_{component}", component)
        if not DISTRIBUTION_PATTERN.fullmatch(distribution):
            raise ConfigError(f"rlhf plugin new --distribution {distribution!r}: a distribution name is letters, digits, "
                              "'-', '_' and '.', starting with a letter and ending with a letter or digit")
        normalized = re.sub(r"[-_.]+", "-", distribution).lower()
        plugin = normalized.removeprefix(DISTRIBUTION_PREFIX) or normalized
        return cls(distribution, normalized.replace("-", "_"), plugin)


def class_name(name: str, suffix: str) -> str:
    """CamelCase of ``name`` ending in ``suffix`` once: my_loss -> MyLoss, my_grpo -> MyGrpoLoss."""
    camel = "".join(part.capitalize() for part in name.split("_"))
    return (camel[: -len(suffix)] if camel.lower().endswith(suffix.lower()) else camel) + suffix


def lowest(version: str) -> str:
    """The requirement a new plugin writes for a distribution at ``version``: this minor release or newer, with no
    upper cap (the core serves a window of plugin APIs and deprecates before it removes: docs/plugin-api.md)."""
    major, minor = (int(part) for part in version.split(".")[:2])
    return f">={major}.{minor}"


def core_range() -> str:
    """The rlhf-core versions a new plugin accepts: this core's minor release (its plugin API) or newer."""
    return lowest(__version__)


def library_requirement(library: str) -> str:
    """A library the plugin builds on (rlhf-agents, rlhf-supervised), from its installed version on."""
    from importlib import metadata

    try:
        return f"{library}{lowest(metadata.version(library))}"
    except metadata.PackageNotFoundError:
        return library


def render(kind: str, name: str, *, package: str | None = None, module: str | None = None,
           distribution: str | None = None) -> dict[str, str]:
    """The files of a new plugin package, by path relative to the package directory; ``package`` and ``module``
    name an existing import package and a new module in it (see :func:`add_component`); ``distribution`` the
    new package's distribution name (see :meth:`Distribution.of`)."""
    spec, name = template_kind(kind), check_name(name)
    names = Distribution.of(name, distribution)
    package = package or names.package
    module = module or spec.module
    values = {
        "name": name, "package": package, "distribution": names.name, "plugin": names.plugin,
        "group": spec.group, "module": module, "kit": spec.kit, "kind": spec.name,
        "label": spec.component.label if spec.component else "lifecycle observer",
        "hook": spec.component.hook_name if spec.component else "",
        "Class": class_name(name, spec.suffix), "Camel": "".join(part.capitalize() for part in name.split("_")),
        "core_range": core_range(), "libraries": "".join(f', "{library_requirement(lib)}"' for lib in spec.libraries), "api": str(PLUGIN_API_VERSION), "doc": spec.doc,
        "select": spec.select.format(name=name, plugin=names.plugin),
    }
    root = resources.files("rlhf_plugin_scaffold") / "templates" / "plugin"
    layout = {
        "pyproject.toml": "pyproject.toml.tmpl",
        "README.md": "README.md.tmpl",
        f"src/{package}/__init__.py": "__init__.py.tmpl",
        f"src/{package}/{module}.py": "component.py.tmpl",
        f"tests/test_{name}.py": "test.py.tmpl",
    }
    files = {}
    for target, template in layout.items():
        source = root / spec.name / template
        if not source.is_file():
            source = root / "common" / template
        if not source.is_file():  # kinds without a separate component module (observers)
            continue
        files[target] = string.Template(source.read_text()).substitute(values)
    return files


def write_plugin(kind: str, name: str, parent: Path, distribution: str | None = None) -> Path:
    """Write the package (``rlhf-plugin-<name>/``, or a folder named after ``distribution``) under ``parent``; an
    existing directory is never overwritten."""
    files = render(kind, name, distribution=distribution)
    directory = Path(parent) / Distribution.of(check_name(name), distribution).name
    if directory.exists():
        raise ConfigError(f"rlhf plugin new: {directory} already exists; choose another name (or --distribution) "
                          "or remove it")
    for relative, text in files.items():
        path = directory / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return directory


def add_component(kind: str, name: str, directory: Path) -> list[Path]:
    """Add a ``kind`` component ``name`` to the existing plugin package in ``directory`` (one with a ``src/<package>/``
    and a ``tests/`` folder, as ``rlhf plugin new`` writes): its module ``src/<package>/<name>.py``, its kit test
    ``tests/test_<name>.py``, and its registration (and options, under the namespace ``name``) appended to the
    package's ``__init__.py``. The added hook functions are named after the component and bound to their hooks
    with ``specname``, so several components of one kind register side by side. Returns the files written."""
    spec = template_kind(kind)
    if spec.component is None:
        raise ConfigError(f"rlhf plugin new {spec.name} --into: an observer's hooks share the module's state; "
                          "write it as a package of its own (without --into)")
    inits = sorted(Path(directory).glob("src/*/__init__.py"))
    if len(inits) != 1 or not (Path(directory) / "tests").is_dir():
        raise ConfigError(f"rlhf plugin new --into {directory}: not a plugin package with one src/<package>/__init__.py "
                          "and a tests/ folder (as rlhf plugin new writes)")
    init = inits[0]
    package = init.parent.name
    files = render(kind, name, package=package, module=name)
    targets = {init.parent / f"{name}.py": files[f"src/{package}/{name}.py"],
               Path(directory) / "tests" / f"test_{name}.py": files[f"tests/test_{name}.py"]}
    for path in targets:
        if path.exists():
            raise ConfigError(f"rlhf plugin new --into: {path} already exists; choose another name")
    hooks = files[f"src/{package}/__init__.py"].split("\n\n\n@rlhf.hookimpl", 1)[1]
    # def rlhf_register_x(register): -> @rlhf.hookimpl(specname="rlhf_register_x") def <name>_register_x(register):
    hooks = re.sub(r"\ndef (rlhf_(\w+))\(", lambda m: f'(specname="{m.group(1)}")\ndef {name}_{m.group(2)}(',
                   "@rlhf.hookimpl" + hooks)
    hooks = hooks.replace("\n\n\n@rlhf.hookimpl\n", "\n\n\n@rlhf.hookimpl")
    for path, text in targets.items():
        path.write_text(text)
    init.write_text(init.read_text().rstrip("\n") + "\n\n\n" + hooks)
    return [init, *targets]
