"""The projection's Python engine: its two queries run by one Python process (DuckDB + delta-rs) instead of Spark: a live batch in tenths
of a second instead of seconds. ``eventlake project --engine python``.

**Interchangeable with the Spark queries, batch by batch.** It keeps the same checkpoints (Structured Streaming's
offset and commit logs, written in Spark's own format: ``offsets/N`` is planned before batch N writes anything,
``commits/N`` after), writes the same tables with the same Delta idempotent-write ids (transaction app id
``<app id>/<table>``, version = the batch id) and commit metadata, the same sequence ledger (``admitted_by`` =
``<app id>/<batch>``) and bookkeeping, and resolves the read models' generations the same way (the per-batch marker
included). So either engine can run any batch of the same projection, and status, rebuild, reprocess and the checks
see no difference.

**The common path only; the rest is Spark's.** A read-models batch is done here when it is what a live stream
almost always is: every record a valid event (``EventEnvelope.from_json``, the definition the Spark parser is
generated from; a test keeps the two in agreement), each aggregate's events continuing its head in the sequence
ledger exactly once, nothing held after a version gap for its aggregates, no ``_pending`` event in a current-state
model. Late events are recorded in ``late_events`` as Spark records them. A batch run again after a crash is done
here too when its first run admitted every event (its writes that committed are skipped by their transaction ids; a
windowed model whose MERGE committed splits its events by the watermark that commit recorded). Everything it checks
is read before it writes anything. Any other batch (a record written around the handler, a replayed or forged
event, a gap) - and any failure while writing one, a lost commit race included - is handed to the Spark query
on the same checkpoint: the batch is already planned in the offset log, so Spark runs exactly it again (its re-run
path: what committed is skipped by its transaction id, the rest is done), then the rest of the log, and stops; then
this engine goes on from Spark's last batch. The Spark session is started on the first such batch only (tens of
seconds, once), so records written around the handler cost a live stream that much delay, nothing else.

The archive's query (``event_archive``) is an append of every valid event, with its own checkpoint: always done
here (records that are not events are the read models' dead letters).

Local tables and checkpoints only (a storage URI: use the Spark engine).

Modules by job: ``run`` (the loop, ``PythonProjection``), ``reader`` (Kafka), ``parsing`` and ``parse_worker`` (records
into event rows, on two cores for large batches), ``key_index`` (what it knows of the tables it writes: on disk),
``tables`` and ``delta_writes`` (delta-rs), ``merge_planning`` (DuckDB), ``batches`` (the archive's and the read models' batch),
``compaction`` (small files), ``errors`` (``HandOver``). The plan it runs and the checkpoint log are
``projection_core``'s, as for the Spark engine; which engine runs is chosen in ``spark_apps.projection``. Nothing here
imports pyspark when loaded (the Spark engine is started only for a hand-over).
"""
