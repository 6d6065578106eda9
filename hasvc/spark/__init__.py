"""hasvc on Spark: the commit log as a PySpark data source, and the export, stats and audit jobs.

Install with ``pip install -e '.[spark]'`` (PySpark 4, pyarrow, numpy; Java 17+ on the PATH).

    from hasvc import spark as hs
    session = hs.session()                      # local[*], quiet, on loopback; registers "hasvc"
    df = session.read.format("hasvc").load("/data/store")
    hs.stats(session, ["/data/store"]).show()

Nothing here imports trio: executors need only this package, ``commitlog``, numpy and pyarrow.
"""

from __future__ import annotations

from hasvc.spark.datasource import NAME, RECORDS_SCHEMA, SEGMENTS_SCHEMA, HasvcDataSource, OptionError
from hasvc.spark.jobs import AuditReport, audit, export, read, register, segments, session, stats

__all__ = [
    "NAME",
    "RECORDS_SCHEMA",
    "SEGMENTS_SCHEMA",
    "AuditReport",
    "HasvcDataSource",
    "OptionError",
    "audit",
    "export",
    "read",
    "register",
    "segments",
    "session",
    "stats",
]
