"""The optimizer: graph -> egglog e-graph, rewrite rules as data (rules/*.rw), bounded
saturation, and cost-based extraction of the fused graph."""
