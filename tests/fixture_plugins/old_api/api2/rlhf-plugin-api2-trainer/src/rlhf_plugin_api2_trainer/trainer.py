"""`rlhf train api2_trainer` (contract: docs/plugins/trainer.md).

A trainer is a whole program: `config_class` is the pydantic tree its flags come from
(`--message`, `--ckpt.output_dir`, YAML with `--config`), and `run` executes once in the CLI
process. This skeleton writes its config to `<output_dir>/api2_trainer.json`; put your training
loop there (rlhf.supervised.trainer.SupervisedTrainer is a base for supervised ones).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field

from rlhf.config.base import Section, flag, plugin_options_field, plugin_set_field


class CkptSection(Section):
    output_dir: str = flag(".", "Where the run writes its results")


class Api2TrainerConfig(Section):
    """The flags of `rlhf train api2_trainer`."""

    message: str = flag("hello", "A value the run records")
    ckpt: CkptSection = Field(default_factory=CkptSection)
    plugins: dict[str, dict[str, Any]] = plugin_options_field()
    plugin_set: list[dict[str, Any]] = plugin_set_field()


class Api2Trainer:
    """`rlhf train api2_trainer`: records its configuration (replace run() with your loop)."""

    config_class: ClassVar[type[Api2TrainerConfig]] = Api2TrainerConfig

    def __init__(self, config: Api2TrainerConfig, plugins: Any, run_dir: Path) -> None:
        self.config, self.plugins, self.run_dir = config, plugins, Path(run_dir)

    def run(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.plugins.train_start(self.config, self.run_dir)
        status = "failed"
        try:
            (self.run_dir / "api2_trainer.json").write_text(json.dumps({"message": self.config.message}))
            status = "completed"
        finally:
            self.plugins.train_end(self.config, self.run_dir, status)
