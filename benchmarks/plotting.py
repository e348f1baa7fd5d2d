"""The benchmarks' one way to get matplotlib: headless, or ``None`` with a note."""

from __future__ import annotations

import sys
from types import ModuleType

__all__ = ["pyplot"]


def pyplot() -> ModuleType | None:
    """``matplotlib.pyplot`` on the Agg backend; ``None`` (and a note on
    stderr) when matplotlib is not installed, so a report still gets written."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot", file=sys.stderr)
        return None
    return plt
