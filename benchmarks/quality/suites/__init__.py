"""Quality suites beyond LoCoMo, run by :func:`harness.run_suite` through the HTTP API.

``python -m benchmarks.quality --suite longmemeval [--data FILE.json]`` and
``--suite beam [--data DIR]``: see :mod:`.longmemeval` and :mod:`.beam` for
the mapping and the figures, :mod:`.harness` for the phases of a run.
"""

from collections.abc import Callable
from pathlib import Path

from .beam import Beam
from .common import Query, Suite
from .harness import add_suite_arguments, run_suite
from .longmemeval import LongMemEval
from .report import write_outputs

__all__ = ["SUITES", "Beam", "LongMemEval", "Query", "Suite", "add_suite_arguments", "run_suite", "write_outputs"]

#: ``--suite`` name -> the suite's class (built from ``--data`` and ``--limit``).
SUITES: dict[str, Callable[[Path, int], Suite]] = {"longmemeval": LongMemEval, "beam": Beam}
