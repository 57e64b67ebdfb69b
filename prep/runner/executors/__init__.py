"""Executors: run task functions in parallel (base protocol, local pool, Ray)."""
