"""The site read model without Spark: ``page_minute_clicks``' ``python_fold`` (the oracle) against hand-computed rows
of a scripted stream (views out of event-time order, duplicated records, a version gap, other domains' events),
its ``fold_sql`` run in DuckDB over the same events as archive rows agreeing with it, and ``merge_update`` combining
two batches' folds giving the fold of both, wherever the stream is cut."""
import datetime as dt

import pyarrow as pa
import pytest

from read_models.iot import MODELS as IOT_MODELS
from read_models.sequence import sequence
from read_models.site import MODELS, PAGE_MINUTE_CLICKS
from read_models.spec import WINDOWED_SUM
from tests.iot_events import duckdb_rows
from tests.iot_events import reading as device_reading
from tests.iot_events import registered as device_registered
from tests.site_events import archive_table, event, registered, viewed


def t(hms: str) -> dt.datetime:
    h, m, s = map(int, hms.split(":"))
    return dt.datetime(2026, 3, 1, h, m, s)


# s1: views out of event-time order (v4 and v6 arrive after later-viewed ones), then retired.
S1 = [registered("s1"),
      viewed("s1", 2, "v1", "/", "u1", "12:00:10"),
      viewed("s1", 3, "v2", "/pricing", "u2", "12:00:50"),
      viewed("s1", 4, "v3", "/", "u1", "12:01:05"),
      viewed("s1", 5, "v4", "/", "u3", "12:00:30"),  # late: viewed before v2 and v3
      viewed("s1", 6, "v5", "/pricing", "u1", "12:01:20"),
      viewed("s1", 7, "v6", "/", "u2", "12:00:05"),  # late again: the earliest view, recorded last
      event("s1", 8, "SiteRetired", "12:05:00", {"reason": "closed"})]
# s2: version 3 never arrives: version 4 waits behind the gap. Its page "/" is s1's page too: another key.
S2 = [registered("s2"),
      viewed("s2", 2, "w1", "/", "u1", "12:00:00"),
      viewed("s2", 4, "w3", "/", "u1", "12:00:40")]
# Another domain's events in the same log: the model selects its own types.
DEVICE = [device_registered("d1"), device_reading("d1", 2, "r1", 21_000, "12:00:10")]
# Log order with duplicated records (the same event id twice).
LOG = [*S1[:4], S1[2], *S1[4:], S1[4], *DEVICE, *S2, S2[1]]
ADMITTED = sequence(LOG).admitted

EXPECTED = {
    ("s1", "/", t("12:00:00")): {"views": 3},         # v1, v4 (late), v6 (late)
    ("s1", "/", t("12:01:00")): {"views": 1},         # v3
    ("s1", "/pricing", t("12:00:00")): {"views": 1},  # v2
    ("s1", "/pricing", t("12:01:00")): {"views": 1},  # v5
    ("s2", "/", t("12:00:00")): {"views": 1},         # w1; w3 waits behind the gap
}


def test_the_model_is_collected_and_registered():
    import read_models

    assert list(MODELS) == ["page_minute_clicks"]
    model = PAGE_MINUTE_CLICKS
    assert model.merge_strategy == WINDOWED_SUM and model.event_types == ("PageViewed",)
    assert model.key == ("site_id", "page", "window_start")
    assert model.columns == ["site_id", "page", "window_start", "window_end", "views", "updated_at"]
    assert read_models.REGISTRY["page_minute_clicks"] is model and not set(MODELS) & set(IOT_MODELS)
    assert set(model.merge_insert) == set(model.columns)
    assert set(model.merge_update) <= set(model.columns) - set(model.key)
    # Views only: a distinct count does not add across batches (the module's docstring says why).
    assert not any("visitor" in c for c in model.columns)


def test_the_oracle_counts_each_view_once_in_its_page_and_viewed_minute():
    assert PAGE_MINUTE_CLICKS.python_fold(ADMITTED) == EXPECTED
    # Duplicated records count once (the fold also dedups by event id; the gap is the sequence rule's job), and
    # the order events are folded in does not matter.
    s1 = {k: v for k, v in EXPECTED.items() if k[0] == "s1"}
    assert {k: v for k, v in PAGE_MINUTE_CLICKS.python_fold(LOG).items() if k[0] == "s1"} == s1
    assert PAGE_MINUTE_CLICKS.python_fold(list(reversed(ADMITTED))) == EXPECTED
    assert PAGE_MINUTE_CLICKS.python_fold(ADMITTED + ADMITTED) == EXPECTED


def _sql_fold(events):
    """``fold_sql`` over ``events`` as archive rows, as ``spark_apps.archive_fold`` runs it: the relation ``events``
    holds the admitted events of the model's types."""
    mine = [e for e in events if e.event_type in PAGE_MINUTE_CLICKS.event_types]
    return duckdb_rows(PAGE_MINUTE_CLICKS.fold_sql, {"events": archive_table(mine)}, PAGE_MINUTE_CLICKS.key)


def test_fold_sql_in_duckdb_agrees_with_the_oracle_and_fills_the_other_columns():
    folded = _sql_fold(ADMITTED)
    assert set(folded) == set(EXPECTED)
    for key, row in EXPECTED.items():
        assert {c: folded[key][c] for c in row} == row, key
        assert set(folded[key]) == set(PAGE_MINUTE_CLICKS.columns)
        assert folded[key]["window_end"] == key[2] + dt.timedelta(minutes=1)
    # updated_at: the latest recorded_at folded into the window (v6, version 7, recorded at 13:00:07).
    assert folded[("s1", "/", t("12:00:00"))]["updated_at"] == t("13:00:07")


def _merged(first, second):
    """The table after folding ``first`` then MERGE-ing the fold of ``second`` with ``merge_update`` (DuckDB)."""
    model = PAGE_MINUTE_CLICKS
    t_rows = duckdb_rows(f"SELECT {', '.join(f'{model.merge_insert[c]} AS {c}' for c in model.columns)} "
                         f"FROM ({model.fold_sql}) s", {"events": archive_table(first)}, model.key)
    s_rows = _sql_fold(second)
    on = " AND ".join(f"t.{k} = s.{k}" for k in model.key)
    update = ", ".join(f"{model.merge_update.get(c, f't.{c}')} AS {c}" for c in model.columns)
    insert = ", ".join(f"{model.merge_insert[c]} AS {c}" for c in model.columns)
    keys = " AND ".join(f"t.{k} IS NULL" for k in model.key)
    sql = (f"SELECT {update} FROM t JOIN s ON {on} UNION ALL SELECT {insert} FROM s LEFT JOIN t ON {on} "
           f"WHERE {keys} UNION ALL SELECT t.* FROM t LEFT JOIN s ON {on} WHERE {keys.replace('t.', 's.')}")
    return duckdb_rows(sql, {"t": pa.Table.from_pylist(list(t_rows.values())),
                             "s": pa.Table.from_pylist(list(s_rows.values()))}, model.key)


@pytest.mark.parametrize("cut", [1, 3, 4, 5])
def test_windowed_merge_update_combines_two_batches_into_the_fold_of_both(cut):
    """Cut 3: the second batch holds the late v4/v6 (into 12:00 of "/", which the first batch made) and v5 (a
    new window); the other cuts put a window's views on both sides in other ways."""
    views = [e for e in ADMITTED if e.event_type == "PageViewed"]
    merged = _merged(views[:cut], views[cut:])
    full = _sql_fold(views)
    assert set(merged) == set(EXPECTED)
    for key, row in merged.items():
        assert row["views"] == EXPECTED[key]["views"], key
        assert (row["window_end"], row["updated_at"]) == (full[key]["window_end"], full[key]["updated_at"]), key
