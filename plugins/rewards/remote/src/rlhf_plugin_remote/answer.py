"""What a reward server's HTTP answer means: the rewards, or the reason in words it is unusable."""

from __future__ import annotations

import json
from typing import Any

#: Client errors a server may answer differently on the next try (timeout, rate limit); any other 4xx will not change.
RETRYABLE_4XX = (408, 429)
EXCERPT_CHARS = 80
#: A wrong path is the usual cause of these; the server's own text ("Not Found") does not say so.
WRONG_PATH_HINT = {status: "; check the URL's path (`rlhf serve reward` answers POST /get_reward)" for status in (404, 405)}


class FailedTry(Exception):
    """One try that got no usable rewards, the reason in words; ``retry`` says whether another try may help,
    ``unreachable`` that no answer came at all (so smaller requests would fail the same way)."""

    def __init__(self, reason: str, retry: bool = True, unreachable: bool = False) -> None:
        super().__init__(reason)
        self.retry, self.unreachable = retry, unreachable


def read_answer(response: Any, count: int) -> dict[str, Any]:
    """The JSON object of an ``httpx`` response carrying ``count`` numeric rewards (and scores, if any)."""
    status = response.status_code
    if not 200 <= status < 300:
        retry = status >= 500 or status in RETRYABLE_4XX
        hint = WRONG_PATH_HINT.get(status, "")
        raise FailedTry(f"answered HTTP {status} {response.reason_phrase}: {_error_text(response)}{hint}", retry)
    try:
        answer = json.loads(response.content)
    except ValueError:
        raise FailedTry(f"answered HTTP {status} with a body that is not JSON: {_excerpt(response.text)}") from None
    if not isinstance(answer, dict):
        raise FailedTry(f"answered JSON that is not an object: {_excerpt(response.text)}")
    if "rewards" not in answer:
        raise FailedTry(f"answered JSON without 'rewards' (keys: {', '.join(answer) or 'none'}); "
                        f"the protocol's answer is {{\"rewards\": [...], \"scores\": [...]?, \"extra_logs\": {{...}}?}}")
    _check_numbers(answer, "rewards", count)
    if answer.get("scores") is not None:
        _check_numbers(answer, "scores", count)
    return answer


def _check_numbers(answer: dict[str, Any], key: str, count: int) -> None:
    values = answer[key]
    if not isinstance(values, list):
        raise FailedTry(f"answered '{key}' that is not a list: {_excerpt(json.dumps(values))}")
    if len(values) != count:
        raise FailedTry(f"answered {len(values)} {key} for {count} samples")
    # bool is an int subclass, but true/false as a reward is a server bug, not a number
    wrong = [v for v in values if isinstance(v, bool) or not isinstance(v, (int, float))]
    if wrong:
        raise FailedTry(f"answered {key} that are not all numbers, e.g. {_excerpt(json.dumps(wrong[0]))}")


def _error_text(response: Any) -> str:
    """The server's own reason: its JSON ``error`` (or FastAPI's ``detail``) field, else the start of the body."""
    try:
        body = json.loads(response.content)
    except ValueError:
        body = None
    if isinstance(body, dict):
        for key in ("error", "detail"):
            if key in body:
                value = body[key]
                return value if isinstance(value, str) else json.dumps(value)[:400]
    return _excerpt(response.text) if response.content else "(empty body)"


def _excerpt(text: str) -> str:
    flat = " ".join(text.split())
    return repr(flat if len(flat) <= EXCERPT_CHARS else flat[:EXCERPT_CHARS] + "…")
