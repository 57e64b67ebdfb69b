"""Canonical JSON manifests: models, schema validation and diff."""
