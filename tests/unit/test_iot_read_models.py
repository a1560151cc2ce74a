"""The IoT read models without Spark: each ``python_fold`` (the oracle) against hand-computed rows of a scripted
stream (readings out of event-time order, duplicated records, a version gap), and each ``fold_sql`` run in DuckDB
over the same events as archive rows agreeing with it; ``merge_update`` combining two batches' folds gives the
fold of both (min/max by least/greatest, counts and sums added)."""
import datetime as dt

import pytest

from read_models.iot import DEVICE_MINUTE_READINGS, DEVICE_STATUS, MODELS, TELEMETRY_ANOMALIES
from read_models.sequence import sequence
from read_models.spec import CURRENT_STATE_BY_VERSION, INSERT_ONCE, WINDOWED_SUM
from tests.iot_events import anomaly, archive_table, duckdb_rows, event, reading, registered


def t(hms: str) -> dt.datetime:
    h, m, s = map(int, hms.split(":"))
    return dt.datetime(2026, 3, 1, h, m, s)


# d1: readings out of event-time order (r4 and r6 arrive after later-measured ones), an anomaly, decommissioned.
D1 = [registered("d1"),
      reading("d1", 2, "r1", 21_000, "12:00:10"),
      reading("d1", 3, "r2", 22_000, "12:00:50"),
      reading("d1", 4, "r3", 20_500, "12:01:05"),
      reading("d1", 5, "r4", 19_000, "12:00:30"),  # late: measured before r2 and r3
      anomaly("d1", 6, "out_of_range_run", "12:01:05", "r3"),
      reading("d1", 7, "r5", -500, "12:01:20"),
      reading("d1", 8, "r6", 18_000, "12:00:20"),  # late again: the last reading recorded, not the newest
      event("d1", 9, "DeviceDecommissioned", "12:05:00", {"reason": "replaced"})]
# d2: version 3 never arrives: version 4 waits behind the gap.
D2 = [registered("d2", heartbeat_s=30),
      reading("d2", 2, "q1", 5, "12:00:00"),
      reading("d2", 4, "q3", 7, "12:00:40")]
# d3: registered, never read, flagged silent.
D3 = [registered("d3"), anomaly("d3", 2, "silent_device", "12:01:00")]
# Log order with duplicated records (the same event id twice).
LOG = [*D1[:4], D1[2], *D1[4:], D1[4], *D2, *D3, D3[1]]
ADMITTED = sequence(LOG).admitted


def test_the_models_are_collected_and_registered():
    import read_models

    assert list(MODELS) == ["device_status", "device_minute_readings", "telemetry_anomalies"]
    assert [m.merge_strategy for m in MODELS.values()] == [CURRENT_STATE_BY_VERSION, WINDOWED_SUM, INSERT_ONCE]
    assert all(read_models.REGISTRY[name] is model for name, model in MODELS.items())
    for model in MODELS.values():
        assert set(model.key) <= set(model.columns)
        assert set(model.merge_insert or model.columns) == set(model.columns)
        assert set(model.merge_update) <= set(model.columns) - set(model.key)


def test_device_status_oracle_last_reading_by_version_last_seen_by_event_time():
    rows = DEVICE_STATUS.python_fold(LOG)
    assert rows[("d1",)] == {
        "device_id": "d1", "site_id": "site-d1", "sensor_kind": "temperature", "unit": "C", "range_min_milli": 0,
        "range_max_milli": 50_000, "heartbeat_interval_s": 60, "status": "decommissioned",
        # r6 was recorded last (version 8) though measured at 12:00:20; the newest measurement is r5's.
        "last_value_milli": 18_000, "last_reading_id": "r6", "last_reading_at": t("12:00:20"),
        "last_seen_at": t("12:01:20"), "readings_count": 6, "anomalies_count": 1, "version": 9,
        "updated_at": t("13:00:09")}
    # The gap: d2 stands at version 2 (q3 waits for version 3).
    assert rows[("d2",)]["version"] == 2 and rows[("d2",)]["readings_count"] == 1
    assert rows[("d2",)]["last_reading_id"] == "q1" and rows[("d2",)]["last_seen_at"] == t("12:00:00")
    assert rows[("d3",)] == {
        "device_id": "d3", "site_id": "site-d3", "sensor_kind": "temperature", "unit": "C", "range_min_milli": 0,
        "range_max_milli": 50_000, "heartbeat_interval_s": 60, "status": "active", "last_value_milli": None,
        "last_reading_id": None, "last_reading_at": None, "last_seen_at": None, "readings_count": 0,
        "anomalies_count": 1, "version": 2, "updated_at": t("13:00:02")}
    assert DEVICE_STATUS.python_fold(LOG + LOG) == rows == DEVICE_STATUS.python_fold(list(reversed(LOG)))


def test_device_minute_readings_oracle_counts_each_reading_once_in_its_measured_minute():
    rows = DEVICE_MINUTE_READINGS.python_fold(ADMITTED)
    assert rows == {
        ("d1", t("12:00:00")): {"unit": "C", "readings": 4, "min_value_milli": 18_000, "max_value_milli": 22_000,
                                "sum_value_milli": 80_000},
        ("d1", t("12:01:00")): {"unit": "C", "readings": 2, "min_value_milli": -500, "max_value_milli": 20_500,
                                "sum_value_milli": 20_000},
        ("d2", t("12:00:00")): {"unit": "C", "readings": 1, "min_value_milli": 5, "max_value_milli": 5,
                                "sum_value_milli": 5},
    }
    # Duplicated records count once (the fold also dedups by event id; the gap is the sequence rule's job).
    assert {k: v for k, v in DEVICE_MINUTE_READINGS.python_fold(LOG).items() if k[0] == "d1"} == \
        {k: v for k, v in rows.items() if k[0] == "d1"}


def test_telemetry_anomalies_oracle_one_row_per_finding():
    rows = TELEMETRY_ANOMALIES.python_fold(LOG)
    assert rows == {
        ("d1", "out_of_range_run", t("12:01:05")): {
            "device_id": "d1", "rule": "out_of_range_run", "occurred_at": t("12:01:05"), "reading_id": "r3",
            "detected_at": t("13:00:06"), "evidence": "out_of_range_run at 12:01:05", "event_id": D1[5].event_id},
        ("d3", "silent_device", t("12:01:00")): {
            "device_id": "d3", "rule": "silent_device", "occurred_at": t("12:01:00"), "reading_id": None,
            "detected_at": t("13:00:02"), "evidence": "silent_device at 12:01:00", "event_id": D3[1].event_id},
    }


def _sql_fold(model, events):
    """``model.fold_sql`` over ``events`` as archive rows, as ``spark_apps.archive_fold`` runs it: the relation
    ``events`` holds the admitted events of the model's types."""
    mine = [e for e in events if e.event_type in model.event_types]
    return duckdb_rows(model.fold_sql, {"events": archive_table(mine)}, model.key)


@pytest.mark.parametrize("name", list(MODELS))
def test_fold_sql_in_duckdb_agrees_with_the_oracle(name):
    model = MODELS[name]
    expected = model.python_fold(ADMITTED)
    folded = _sql_fold(model, ADMITTED)
    assert set(folded) == set(expected)
    for key, row in expected.items():
        assert {c: folded[key][c] for c in row} == row, key


def test_device_status_fold_sql_gives_the_version_range_the_runner_checks():
    folded = _sql_fold(DEVICE_STATUS, ADMITTED)
    assert {k: (r["first_version"], r["version"], r["_events"]) for k, r in folded.items()} == \
        {("d1",): (1, 9, 9), ("d2",): (1, 2, 2), ("d3",): (1, 2, 2)}


def _merged(model, first, second):
    """The table after folding ``first`` then MERGE-ing the fold of ``second`` with ``merge_update`` (DuckDB)."""
    import pyarrow as pa

    # The table as the first batch's MERGE inserted it, and the second batch's folded changes.
    t_rows = duckdb_rows(f"SELECT {', '.join(f'{model.merge_insert[c]} AS {c}' for c in model.columns)} "
                         f"FROM ({model.fold_sql}) s", {"events": archive_table(first)}, model.key)
    s_rows = _sql_fold(model, second)

    on = " AND ".join(f"t.{k} = s.{k}" for k in model.key)
    update = ", ".join(f"{model.merge_update.get(c, f't.{c}')} AS {c}" for c in model.columns)
    insert = ", ".join(f"{model.merge_insert[c]} AS {c}" for c in model.columns)
    keys = " AND ".join(f"t.{k} IS NULL" for k in model.key)
    sql = (f"SELECT {update} FROM t JOIN s ON {on} UNION ALL SELECT {insert} FROM s LEFT JOIN t ON {on} "
           f"WHERE {keys} UNION ALL SELECT t.* FROM t LEFT JOIN s ON {on} WHERE {keys.replace('t.', 's.')}")
    return duckdb_rows(sql, {"t": pa.Table.from_pylist(list(t_rows.values())),
                             "s": pa.Table.from_pylist(list(s_rows.values()))}, model.key)


def test_windowed_merge_update_combines_two_batches_into_the_fold_of_both():
    readings = [e for e in ADMITTED if e.event_type == "ReadingRecorded"]
    # The second batch holds the late r4/r6 (new minimum 18 000 in 12:00) and r5 (new minimum -500 in 12:01).
    first = [e for e in readings if e.payload["reading_id"] in ("r1", "r2", "r3")]
    second = [e for e in readings if e not in first]
    merged = _merged(DEVICE_MINUTE_READINGS, first, second)
    expected = DEVICE_MINUTE_READINGS.python_fold(readings)
    assert {k: {c: merged[k][c] for c in row} for k, row in expected.items()} == expected
    assert set(merged) == set(expected)


def test_device_status_merge_update_continues_a_row_with_the_next_versions():
    d1 = [e for e in ADMITTED if e.aggregate_id == "d1"]
    for cut in (1, 4, 6, 8):  # a second batch with readings, with none (the decommission only), ...
        merged = _merged(DEVICE_STATUS, d1[:cut], d1[cut:])
        expected = DEVICE_STATUS.python_fold(d1)[("d1",)]
        assert {c: merged[("d1",)][c] for c in expected} == expected, cut
