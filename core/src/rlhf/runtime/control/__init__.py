"""The controller process of an RL run: its step, the async pipeline, rewards, advantages, KL control and steering."""
