"""Every flag of OpenRLHF 0.11's supervised parsers means something to ``rlhf train sft|rm|dpo``.

``tests/data/openrlhf_supervised_flags.json`` lists the flags that ``train_sft``, ``train_rm`` and
``train_dpo`` of OpenRLHF 0.11 define (DeepSpeed era: ``--ds.*``; the optimizer, scheduler and
clipping at the top level, gradient checkpointing under ``--model``). Each one is a flag of the
trainer, or an entry of its translation table that is not a removal; ``--use_ms`` is refused with
the reason ``train ppo`` gives. The 0.11 spellings dump the config their rlhf spellings dump.
"""

from __future__ import annotations

import json
import logging
from functools import cache
from pathlib import Path

import pytest
import yaml
from rlhf_plugin_openrlhf_compat.tables import Removed
from rlhf_plugin_openrlhf_compat.translation import table_for

from rlhf.cli.main import main
from rlhf.config.loading import ConfigParser
from rlhf.config.ppo import PPOConfig
from rlhf.config.refused import refusals
from rlhf.host.plugin_host import PluginHost
from rlhf.host.selection import PluginSelection
from rlhf.registry import ComponentKind
from rlhf.testing.cli import assert_user_error, run_rlhf

FLAGS: dict[str, list[str]] = json.loads((Path(__file__).parent / "data" / "openrlhf_supervised_flags.json").read_text())
TRAINERS = {"train_sft": "sft", "train_rm": "rm", "train_dpo": "dpo"}
#: every trainer on the supervised config takes the 0.11 spellings, not only the three whose parsers were swept
SUPERVISED_TRAINERS = ["sft", "rm", "dpo", "kto", "kd", "prm"]
#: the run name is pinned because its default is the clock's minute, which two dumps a moment apart can straddle
BASE = ["--model.model_name_or_path", "m", "--data.dataset", "d.jsonl", "--logger.wandb.run_name", "pinned"]
REQUIRED = {"kd": ["--teacher.model_name_or_path", "t"]}


@cache
def host() -> PluginHost:
    return PluginHost.load(PluginSelection.parse(None))


def config_class(trainer: str) -> type:
    return host().registry.get(ComponentKind.TRAINER, trainer).config_class


@pytest.mark.parametrize(("module", "trainer"), TRAINERS.items())
def test_every_openrlhf_0_11_flag_of_the_supervised_cli_has_a_meaning(module: str, trainer: str) -> None:
    cls = config_class(trainer)
    parser = ConfigParser(cls, host(), prog=f"rlhf train {trainer}")
    table = table_for("", cls)
    assert len(FLAGS[module]) >= 77
    missing = [flag for flag in FLAGS[module]
               if flag not in parser.flags and (flag not in table or isinstance(table[flag], Removed))]
    assert not missing, f"rlhf train {trainer} does not take OpenRLHF {module}'s {missing}"


def dumped(trainer: str, argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict:
    assert main(["train", trainer, *BASE, *REQUIRED.get(trainer, []), *argv, "--print-config"]) == 0
    return yaml.safe_load(capsys.readouterr().out)


@pytest.mark.parametrize("trainer", SUPERVISED_TRAINERS)
def test_0_11_parser_spellings_give_the_config_of_rlhfs(trainer: str, capsys, caplog) -> None:
    openrlhf = ["--model.gradient_checkpointing_enable", "--model.gradient_checkpointing_reentrant", "--optim", "muon",
                "--min_lr_ratio", "0.05", "--ckpt.save_hf", "--ckpt.disable_ds", "--train.full_determinism_enable"]
    ours = ["--train.gradient_checkpointing_enable", "--train.gradient_checkpointing_reentrant", "--train.optim", "muon",
            "--train.min_lr_ratio", "0.05", "--train.full_determinism_enable"]
    with caplog.at_level(logging.WARNING, logger="rlhf.openrlhf_compat"):
        translated = dumped(trainer, openrlhf, capsys)
    warnings = [r.getMessage() for r in caplog.records if r.name == "rlhf.openrlhf_compat"]
    assert translated == dumped(trainer, ours, capsys)
    train = translated["train"]
    assert train["gradient_checkpointing_enable"] and train["gradient_checkpointing_reentrant"]
    assert (train["optim"], train["min_lr_ratio"], train["full_determinism_enable"]) == ("muon", 0.05, True)
    assert len(warnings) == 1 and "--ckpt.save_hf ignored" in warnings[0] and "--ckpt.disable_ds ignored" in warnings[0]


def test_use_ms_is_refused_with_the_reason_train_ppo_gives() -> None:
    reason = refusals(PPOConfig)["use_ms"]
    assert all(refusals(config_class(trainer))["use_ms"] == reason for trainer in SUPERVISED_TRAINERS)
    for trainer in ("sft", "dpo"):
        result = run_rlhf("train", trainer, *BASE, "--use_ms", "--print-config", timeout=120)
        assert_user_error(result, "--use_ms", reason)
        assert "unrecognized" not in result.stderr and "did you mean" not in result.stderr
