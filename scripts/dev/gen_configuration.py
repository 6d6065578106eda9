"""Write the settings reference of docs/configuration.md from the settings table.

    .venv/bin/python scripts/dev/gen_configuration.py [--check] [--doc FILE]

The block between the markers in docs/configuration.md (``<!-- BEGIN GENERATED SETTINGS ... -->``
and ``<!-- END GENERATED SETTINGS -->``) is written anew from ``hasvc/settings.py`` (each
setting's reason is its dataclass field's, next to its default); the hand-written parts around
it are kept as they are. Run it after adding or changing a setting.

--check   write nothing; exit 1 (saying so) when the document is out of date, 0 otherwise
--doc     another copy of the document (default: docs/configuration.md of this checkout)
"""

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOC = os.path.join(ROOT, "docs", "configuration.md")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     usage="gen_configuration.py [--check] [--doc FILE]")  # fmt: skip
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when the document is out of date")
    parser.add_argument("--doc", default=DOC, help="the document (default: docs/configuration.md)")
    args = parser.parse_args()
    sys.path.insert(0, ROOT)
    from hasvc.settings import render_document

    with open(args.doc, encoding="utf-8") as file:
        current = file.read()
    try:
        wanted = render_document(current)
    except ValueError as error:
        print(f"{args.doc}: {error}", file=sys.stderr)
        return 2
    if wanted == current:
        print(f"{args.doc}: up to date")
        return 0
    if args.check:
        print(f"{args.doc}: out of date; run .venv/bin/python scripts/dev/gen_configuration.py", file=sys.stderr)
        return 1
    with open(args.doc, "w", encoding="utf-8") as file:
        file.write(wanted)
    print(f"{args.doc}: settings reference written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
