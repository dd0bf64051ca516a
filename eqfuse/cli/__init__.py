"""The `eqfuse` command line."""
