"""The RL loop of ``rlhf train ppo``: ``control`` (the controller and its step), ``workers`` (the Ray actors that
hold models), ``rollout`` (the client of the rollout engines), ``sync`` (weights to the engines) and ``cluster``
(Ray start-up, placement, the session watchdog). Not public: plugins build on the modules docs/plugin-api.md lists."""
