"""eqfuse's version: part of every cache key and of every artifact's manifest."""

__version__ = "0.1.0"
