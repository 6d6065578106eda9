"""``python -m hasvc``: the same as the ``hasvc`` console script (and ``python -m hasvc.cli``)."""

from hasvc.cli import main

main()
