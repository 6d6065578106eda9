"""pytest imports test files by their base name (no packages under tests/): two test files with
one name in two folders stop the whole run at collection. This keeps it from landing."""

import collections
import os

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_test_file_name_is_unique_across_the_test_folders():
    seen = collections.defaultdict(list)
    for directory, _, names in os.walk(TESTS):
        for name in names:
            if name.startswith("test_") and name.endswith(".py"):
                seen[name].append(os.path.relpath(os.path.join(directory, name), TESTS))
    assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}
