"""The graph IR every later stage works on: the graph, the op table, types and shapes, the
kernel shapes the backend lowers, the .g printer and the numpy reference interpreter (the oracle).

The op table is one registry (eqfuse.ir.ops.OPS) filled by the modules that define its ops; they
are imported here, once, so that the table is whole whichever module of eqfuse.ir is imported.
"""
# ruff: noqa: I001

# isort: off  (ruff: noqa: I001; the order of the table: the core ops, then the mask, index and pooling ops, the
# attention gradients and the row ops of derivative rules)
from eqfuse.ir import ops  # noqa: F401
from eqfuse.ir import ops_index  # noqa: F401
from eqfuse.ir import ops_attention  # noqa: F401
from eqfuse.ir import ops_grad  # noqa: F401
from eqfuse.ir import ops_quant  # noqa: F401
# isort: on
