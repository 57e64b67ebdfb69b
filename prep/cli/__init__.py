"""Thin click wrappers over prep's library functions."""
