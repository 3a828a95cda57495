"""Capture layer: everything that hooks or patches MindSpore. Every install returns a Handle."""
