"""The layer kinds of a MiniMax-M3 sparse model, shared by the plugin and its pool (neither imports the other)."""

DENSE = "attention"
SPARSE = "sparse_attention"
