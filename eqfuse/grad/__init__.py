"""Reverse-mode differentiation: derivative rules as data (derivatives.rw), the joint graph
(vjp.grad_graph) and their numerical check (check.check_derivatives, `eqfuse check-grads`)."""

from eqfuse.grad.emitter import GradError
from eqfuse.grad.vjp import grad_graph

__all__ = ["grad_graph", "GradError"]
