"""The Ray actors that hold models (actor, reference, critic, reward model), their groups and their batches."""
