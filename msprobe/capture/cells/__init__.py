"""Cell (L0) capture: PyNative hooks and the GRAPH_MODE probes."""
