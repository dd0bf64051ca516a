"""The runtime: the compiled Module and the one C entry point per graph that runs its plan."""
