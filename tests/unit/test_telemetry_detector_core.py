"""The telemetry detector without Spark: its per-device fold of a batch's rows (as pandas hands them to it) and
``eventlake detect-anomalies`` (the streaming runs are in tests/integration/test_telemetry_detector.py)."""
import math


from event_store.iot.telemetry_rules import OUT_OF_RANGE_RUN, TelemetryState
from spark_apps.telemetry_detector import fold_rows

NAN = math.nan


def test_a_batch_is_folded_in_version_order_whatever_order_its_rows_come_in():
    import pandas as pd

    # Spark's longs with nulls arrive as float64 NaN; the rows of one device in any order.
    columns = ["aggregate_version", "event_type", "time_ms", "reading_id", "value_milli", "range_min_milli",
               "range_max_milli", "heartbeat_interval_s"]
    rows = pd.DataFrame([
        (4, "ReadingRecorded", 30_000, "r30", 60_000.0, NAN, NAN, NAN),
        (1, "DeviceRegistered", 0, None, NAN, 0.0, 50_000.0, 60.0),
        (3, "ReadingRecorded", 20_000, "r20", 60_000.0, NAN, NAN, NAN),
        (2, "ReadingRecorded", 10_000, "r10", 60_000.0, NAN, NAN, NAN),
        (5, "DeviceDecommissioned", 40_000, None, NAN, NAN, NAN, NAN),
    ], columns=columns)
    state, findings = fold_rows(TelemetryState(), rows)
    assert [(f.rule, f.reading_id) for f in findings] == [(OUT_OF_RANGE_RUN, "r30")]
    assert (state.last_version, state.heartbeat_ms, state.decommissioned) == (5, 60_000, True)
    again, repeated = fold_rows(state, rows)  # a replayed batch
    assert (again, repeated) == (state, [])


def test_eventlake_detect_anomalies_is_a_subcommand():
    from eventlake.cli import build_parser

    assert build_parser().parse_args(["detect-anomalies", "--until-caught-up"]).until_caught_up
    assert not build_parser().parse_args(["detect-anomalies"]).until_caught_up
