"""Typed configuration: pydantic trees, dotted flags, YAML files and plugin option namespaces."""

from rlhf.config.base import ConfigError

__all__ = ["ConfigError"]
