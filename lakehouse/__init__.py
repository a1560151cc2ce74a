"""The bottom layer: the configuration and storage access every other layer uses, and nothing above it.

- ``lakehouse.settings``: the one settings object (where the Kafka log, the Delta warehouse and the checkpoints
  are; topic names; tuning), read from the environment or a TOML file;
- ``lakehouse.storage``: where the tables and checkpoints are: a local ``Path`` or a URI (``hdfs://``, ``s3a://``
  ...) reached through delta-rs' object store with the settings' storage options;
- ``lakehouse.tables``: a Delta table's current version read into Arrow without a JVM;
- ``lakehouse.signals``: how a long-running service (handler, projection, detector, policy, SQL server) learns
  that it is asked to stop.

Why "lakehouse": these modules say where the lakehouse is (the log it is derived from, its tables, their
checkpoints) and how to read it, for every layer from ``event_store`` up. ``signals`` is here for the same reason
the rest is: the Spark services (``spark_apps``) and the ones the CLI runs (the handler, the policy, the SQL server)
all need it, and the bottom is the one layer each may import.

The rule (``tests/unit/test_layering.py``): these modules import nothing else from the repository, and nothing
below the top (``eventlake``: the CLI, the demo, the generator, SQL reads) imports ``eventlake``. The catalog of
read-model generations is not here: it knows the read models (their names and merge strategies), so it lives one
layer up, in ``read_models.catalog``.
"""
