"""Weights from the actor ranks to the rollout engines, through the chosen weight-sync transport."""
