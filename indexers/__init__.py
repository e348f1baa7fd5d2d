"""Backends: one module per store, each implementing :class:`Source`."""
