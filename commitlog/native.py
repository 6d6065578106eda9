"""The optional native module (``commitlog/_scan.c``), in one place.

``setup.py`` builds it when a C compiler is present. Every function in it has a pure-Python twin
that produces the same bytes and results (the tests compare them); ``HASVC_NO_NATIVE=1`` in the
environment turns the native paths off.
"""

from __future__ import annotations

import os
import warnings

# The VERSION of _scan.c this code calls (its functions and their arguments): a build left in
# place by an older checkout is not used (and a warning says to rebuild), never called wrongly.
NATIVE_VERSION = 13

if os.environ.get("HASVC_NO_NATIVE") == "1":
    module = None
else:
    try:  # pragma: no cover - depends on the build
        from commitlog import _scan as module
    except ImportError:  # pragma: no cover
        module = None
    if module is not None and getattr(module, "VERSION", None) != NATIVE_VERSION:  # pragma: no cover
        warnings.warn(f"commitlog/_scan is version {getattr(module, 'VERSION', 1)}, this code needs "
                      f"{NATIVE_VERSION}: the pure-Python paths are used; rebuild it (pip install -e .)", stacklevel=1)  # fmt: skip
        module = None

AVAILABLE = module is not None
scan = module.scan if module else None
write_batch = module.write_batch if module else None
populate = module.populate if module else None
sync_range = module.sync_range if module else None
dispatch_units = module.dispatch_units if module else None
crc_ranges = module.crc_ranges if module else None
check_spans = module.check_spans if module else None
walk_starts = module.walk_starts if module else None
split_messages = module.split_messages if module else None
check_entries = module.check_entries if module else None
index_units = module.index_units if module else None
crc32 = module.crc32 if module else None
write_entries = module.write_entries if module else None
cut_records = module.cut_records if module else None
record_sizes = module.record_sizes if module else None
record_offsets = module.record_offsets if module else None
pack_offset_pairs = module.pack_offset_pairs if module else None
plan_pass = module.plan_pass if module else None
write_pass = module.write_pass if module else None
write_entry_pass = module.write_entry_pass if module else None
split_frames = module.split_frames if module else None
encode_answers = module.encode_answers if module else None
