"""Tracing: a Python function over eqfuse.numpy (or numpy) run on traced arrays becomes a graph."""
