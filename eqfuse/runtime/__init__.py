"""The runtime: the compiled Module and the one C entry point per graph that runs its plan."""

# Module.save and pickling go through the artifact module, which registers itself on Module
from eqfuse.runtime import artifact  # noqa: F401
