"""``python -m braid.cli``: the ``braid`` command line."""

from . import main

main()
