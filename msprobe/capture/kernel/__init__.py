"""Kernel (L2) dump through MindSpore's own dump facility."""
