"""A ``dim_merchant`` history made for a log's payments, with every case of the as-of join
(``read_models.enrichment``): merchants the dimension never knew, known from before every payment, loaded after
every payment (a late-arriving dimension: each payment takes the first version), changed midway (a payment at the
change's exact time takes the new version) and closed midway (payments after it get nulls). Odd values (quotes,
Unicode) on purpose."""
from __future__ import annotations

from collections import defaultdict
from datetime import timedelta

from event_store.envelope import parse_time
from read_models.enrichment import MERCHANT_TABLE

__all__ = ["dimension_rows", "dimension_table", "write_dimension", "reference"]

_RISK = ("low", "medium", "high")


def dimension_rows(events) -> list[dict]:
    """Rows of ``dim_merchant`` (``reference_data.merchants.dimension_schema``'s columns) for the merchants of the
    payments among ``events``: merchant i (in id order) is of case i % 5 (module docstring)."""
    times = defaultdict(list)
    for e in events:
        if e.event_type in ("PaymentAuthorized", "PaymentDeclined"):
            times[e.payload["merchant_id"]].append(parse_time(e.occurred_at, "occurred_at"))
    hour = timedelta(hours=1)
    rows = []
    for i, merchant in enumerate(sorted(times)):
        ts = sorted(times[merchant])
        first, mid, last = ts[0], ts[len(ts) // 2], ts[-1]

        def version(n, valid_from, valid_to):
            return {"merchant_id": merchant, "name": f"Café «{merchant}» 'v{n}'", "mcc": f"{5411 + n:04d}",
                    "country": "GB", "risk_level": _RISK[(i + n) % 3], "attr_hash": f"h{i}-{n}",
                    "valid_from": valid_from, "valid_to": valid_to, "is_current": valid_to is None,
                    "load_id": f"load-{n}"}
        case = i % 5
        if case == 1:
            rows.append(version(1, first - hour, None))
        elif case == 2:
            start = first + (mid - first) / 2 if mid > first else first - hour
            rows += [version(1, start, mid), version(2, mid, None)]
        elif case == 3:
            rows.append(version(1, first - hour, mid))
        elif case == 4:
            rows.append(version(1, last + hour, None))
    return rows


def dimension_table(events):
    """``dimension_rows`` as Arrow, in ``dim_merchant``'s schema."""
    import pyarrow as pa

    from reference_data.merchants import dimension_schema

    return pa.Table.from_pylist(dimension_rows(events), schema=dimension_schema())


def write_dimension(settings, events) -> None:
    """Write ``dimension_table(events)`` as the home's ``dim_merchant``."""
    from deltalake import write_deltalake

    write_deltalake(str(settings.table_path(MERCHANT_TABLE)), dimension_table(events), mode="overwrite")


def reference(events) -> dict[str, list[dict]]:
    """What ``ReadModel.expected_rows`` takes for ``events``' dimension."""
    return {MERCHANT_TABLE: dimension_rows(events)}
