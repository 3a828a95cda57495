"""Tensors: describing a MindSpore value into plain records, reading tensors on the host, and the
exact statistics (compiled kernel with a NumPy fallback)."""
