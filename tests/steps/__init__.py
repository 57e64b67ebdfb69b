"""Tests of the per-document steps: their settings, the length filter, builds with steps."""
