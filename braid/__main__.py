"""``python -m braid``: the ``braid`` command line."""

from .cli import main

main()
