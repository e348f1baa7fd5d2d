"""Pure ranking and formatting: no I/O."""
