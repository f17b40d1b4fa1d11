"""The ``code_tests`` reward (see the package docstring)."""

from __future__ import annotations

import re
from typing import Any

from rlhf_plugin_code.sandbox import SandboxLimits, backend, run

FENCE = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.DOTALL)


def extract_code(response: str) -> str:
    blocks = FENCE.findall(response)
    return blocks[-1] if blocks else response


class CodeTestsReward:
    needs_labels = True  # the label holds the tests; the core refuses a run without --data.label_key

    def __init__(self, limits: SandboxLimits | None = None) -> None:
        self.limits = limits or SandboxLimits()

    @classmethod
    def from_config(cls, config: Any) -> CodeTestsReward:
        limits = SandboxLimits.model_validate(config.plugins.get("code", {}))
        backend(limits.isolation)  # a named backend missing here is an error at start, not at the first reward
        return cls(limits)

    def __call__(self, queries: list[str], prompts: list[str], labels: list[Any], **columns: Any) -> dict[str, Any]:
        rewards, reasons = [], {}
        for query, prompt, tests in zip(queries, prompts, labels):
            code = extract_code(query[len(prompt):].replace("</s>", ""))
            result = run(code, self.limits, tests)
            rewards.append(float(result.passed))
            reasons[result.reason] = reasons.get(result.reason, 0) + 1
        extra = {f"code/{reason}": [count / len(rewards)] for reason, count in reasons.items()}
        return {"rewards": rewards, "extra_logs": extra}
