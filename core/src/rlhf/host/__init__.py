"""The plugin host: discovering installed plugins, choosing them (--plugins), their registries and options, and which
first-party package provides a missing name."""
