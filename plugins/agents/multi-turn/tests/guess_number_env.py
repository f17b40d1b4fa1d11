"""Guess the number (1-4), with feedback "higher" / "lower": a tiny multi-turn environment.

The secret is the prompt's label. Each model turn is a guess (the first digit in the turn's
text); a correct guess ends the episode with reward 1 - 0.25 * (turns before it), anything
else gets feedback and the next turn, at most 4 turns.
"""

import re

from rlhf_agents import AgentInstanceBase

MAX_TURNS = 4


class AgentInstance(AgentInstanceBase):
    async def reset(self, states):
        self.secret, self.turn = int(states["label"]), 0
        return {"observation": states["observation"]}

    async def step(self, states):
        self.turn += 1
        digit = re.search(r"\d", states["action_text"])
        guess = int(digit.group()) if digit else None
        correct = guess == self.secret
        reward = 1.0 - 0.25 * (self.turn - 1) if correct else 0.0
        done = correct or self.turn >= MAX_TURNS
        if guess is None:
            feedback = " a number please "
        else:
            feedback = " higher " if guess < self.secret else " lower "
        return {"rewards": reward, "scores": float(correct), "environment_feedback": "" if done else feedback,
                "done": done, "extra_logs": {"turns": self.turn}}
