"""The engine-neutral projection core: what a projection *is*, written once and run by either engine.

``checkpoint``: Structured Streaming's checkpoint log (``offsets/N``, ``commits/N``, ``metadata``, ``sources/0/0``),
the one module that reads and writes that format (both engines, ``eventlake status``, the reconciliation and the
benchmarks use it). ``positions``: how far the log goes and how far a projection is from it (a log that ends in a
transaction marker included). ``plan``: a projection's tables, generations and idempotent-write ids. ``errors``:
what stops a projection.

It imports only ``lakehouse``, ``event_store`` and ``read_models``: never an engine (``spark_apps``,
``python_engine``), so both stand on it and neither on the other.
"""
