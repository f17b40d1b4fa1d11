"""The rollout engines as the controller drives them: engine actors, agent rollouts, sleep between phases."""
