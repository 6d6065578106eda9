"""``python -m hasvc.cli``: the same as the ``hasvc`` console script."""

from hasvc.cli import main

main()
