"""The prompt-source kit (docs/plugins/prompt-source.md): rows by position, rows a prompt file could hold, and a
state that makes a restored source make the same rows."""

from __future__ import annotations

import json
from typing import Any

from rlhf.components import PromptOutcome
from rlhf.registry import ComponentKind
from rlhf.testing.conformance._core import ComponentKit, ContractProperties, fail, first_failure, not_collected, show

SOURCE = ComponentKind.PROMPT_SOURCE.label


def check_prompt_source(source: Any, fresh: Any = None, input_key: str = "input", label_key: str | None = None) -> None:
    """``rows(start, count)`` makes ``count`` dicts, each the same whatever call made it; each holds ``input_key``
    (non-empty text or chat messages), ``label_key`` when given, and is JSON (rollout dumps, checkpoints); after
    ``observe`` moves it, ``state()`` is JSON and ``fresh`` (the source built again) restored from it makes the rows
    ``source`` makes."""

    def by_position() -> str | None:
        whole = source.rows(0, 6)
        if not isinstance(whole, list) or len(whole) != 6:
            return f"rows(0, 6) returned {show(whole)}, not a list of 6 rows"
        if source.rows(0, 0) != []:
            return "rows(0, 0) is not []"
        if (part := source.rows(2, 3)) != whole[2:5]:
            return f"rows(2, 3) differs from rows(0, 6)[2:5]: a row must depend on its position only ({show(part)})"
        return None

    def file_like() -> str | None:
        for position, row in enumerate(source.rows(0, 6)):
            if not isinstance(row, dict):
                return f"row {position} is {type(row).__name__}, not a dict"
            value = row.get(input_key)
            if not (isinstance(value, str) and value.strip()) and not (
                    isinstance(value, list) and value and all(isinstance(m, dict) and "role" in m for m in value)):
                return f"row {position} has no text or chat messages under {input_key!r} ({show(row)})"
            if label_key and row.get(label_key) is None:
                return f"row {position} has no {label_key!r} (--data.label_key)"
            try:
                json.dumps(row)
            except (TypeError, ValueError) as exc:
                return f"row {position} is not JSON ({exc}): rollout dumps and reward workers carry its fields"
        return None

    def restored() -> str | None:
        if not (hasattr(source, "state") and hasattr(source, "restore")):
            return None if not hasattr(source, "observe") else "observe without state()/restore(): a resume forgets it"
        rows = source.rows(0, 4)
        if hasattr(source, "observe"):
            source.observe([PromptOutcome(p, row, (1.0, 1.0)) for p, row in enumerate(rows)])
        state = json.loads(json.dumps(source.state()))
        if fresh is None:
            return None
        fresh.restore(state)
        if fresh.rows(10, 3) != source.rows(10, 3):
            return f"a fresh source restored from state() {show(state)} makes other rows at positions 10-12"
        return None

    first_failure(SOURCE, "rows by position", [("rows(0, 6), rows(2, 3), rows(0, 0)", by_position)])
    first_failure(SOURCE, "rows a prompt file could hold", [(f"rows(0, 6) read with {input_key!r}", file_like)])
    first_failure(SOURCE, "the same rows after a restore", [("observe 4 rows, state(), restore()", restored)])


class PromptSourceKit(ContractProperties, ComponentKit):
    kind = ComponentKind.PROMPT_SOURCE
    contract_properties = ("rows by position", "rows a prompt file could hold", "the same rows after a restore")

    @not_collected
    def test_contract(self) -> None:
        data = self.run_config().data
        made = self.make_component()
        if made is None:
            raise fail(SOURCE, "kit set-up", "make_component() returned None")
        check_prompt_source(made, self.make_component(), data.input_key, data.label_key)

    def test_picklable(self) -> None:
        """A source lives in the controller only: nothing ships it between processes."""
