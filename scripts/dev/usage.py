"""What every positional-argument script of scripts/dev does first: ``-h``/``--help`` prints its
docstring and exits 0; too few arguments print it and exit 2. Nothing is started either way."""

import sys


def help_or_usage(doc: str, *, arguments_min: int) -> None:
    args = sys.argv[1:]
    if args[:1] in (["-h"], ["--help"]):
        print(doc.strip())
        raise SystemExit(0)
    if len(args) < arguments_min:
        print(doc.strip(), file=sys.stderr)
        raise SystemExit(2)
