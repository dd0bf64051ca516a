"""The graph IR every later stage works on: the graph, the op table, types and shapes, the
.g printer and the numpy reference interpreter (the oracle)."""
