from pydantic import BaseModel, Field


class EchoOptions(BaseModel):
    model_config = {"extra": "forbid"}

    scale: float = Field(0.01, description="reward per character")
    prefix: str = Field("", description="only count responses starting with this")


class EchoLength:
    """reward = scale x response length, or 0 when the response does not start with prefix."""

    def __init__(self, options: EchoOptions) -> None:
        self.options = options

    @classmethod
    def from_config(cls, config):
        return cls(EchoOptions.model_validate(config.plugins.get("echo", {})))

    def __call__(self, queries, prompts, labels, **kwargs):
        rewards = []
        for query, prompt in zip(queries, prompts):
            response = query[len(prompt):]
            rewards.append(self.options.scale * len(response) if response.startswith(self.options.prefix) else 0.0)
        return rewards
