"""Prompt datasets, chat templates and batching."""
