from pydantic import BaseModel, Field


class EchoOptions(BaseModel):
    model_config = {"extra": "forbid"}

    scale: float = Field(0.01, description="reward per character")
    prefix: str = Field("", description="only count responses starting with this")


def echo_length(queries, prompts, labels, **kwargs):
    return [len(q) - len(p) for q, p in zip(queries, prompts)]
