"""``python -m goodput ...``: the same as the ``goodput`` console script."""

from goodput.cli import main

main()
