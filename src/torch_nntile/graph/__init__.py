"""Tensor graph: data nodes, op nodes, the pending phase and axis groups."""
