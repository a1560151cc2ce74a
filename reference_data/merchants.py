"""What a merchant is as reference data: its columns, how a source value becomes one, the hash of its attributes.

Pure (pyarrow schemas only, built on demand): the extractors (``reference_data.extract``) type every source's rows
with :func:`typed_row`, the suite (``expectations.merchants``) checks their values, and the SCD2 merge
(``reference_data.scd2``) compares versions by :func:`attribute_hash`.
"""
from __future__ import annotations

import hashlib

from expectations.reference.merchants import RISK_LEVELS  # the suite owns the value rules
from lakehouse.errors import BadInput

__all__ = ["COLUMNS", "KEY", "ATTRIBUTES", "RISK_LEVELS", "MerchantInputError", "typed_row", "attribute_hash",
           "staged_schema", "dimension_schema"]

KEY = "merchant_id"
# The attributes whose change opens a new version of a merchant (a column added here changes every hash:
# the next load would then open a new version of every merchant, so add columns with care).
ATTRIBUTES = ("name", "mcc", "country", "risk_level")
COLUMNS = (KEY, *ATTRIBUTES)


class MerchantInputError(BadInput, ValueError):
    """A merchants source that cannot be read as merchants: its header, its encoding, its size, a value's type.
    The message names the source and the reason; nothing is loaded."""


def typed_row(values: dict, where: str) -> dict:
    """One source row (column -> value as the source gave it) as the staged row: every column a string or None
    (blank is None), ``mcc`` given as an integer written with four digits. A value of another type (a list, an
    object, a float, a boolean) is refused naming ``where`` (the source and line)."""
    row = {}
    for column in COLUMNS:
        value = values.get(column)
        if value is None:
            row[column] = None
        elif isinstance(value, bool) or not isinstance(value, (str, int)) or (isinstance(value, int)
                                                                             and column != "mcc"):
            raise MerchantInputError(f"{where}: {column} is {type(value).__name__} {value!r}, expected "
                                     + ("a string or an integer" if column == "mcc" else "a string"))
        elif isinstance(value, int):
            row[column] = f"{value:04d}" if 0 <= value <= 9999 else str(value)
        else:
            row[column] = value.strip() or None
    return row


def attribute_hash(row: dict) -> str:
    """A stable hash of a merchant's attributes (what tells an unchanged version from a changed one)."""
    text = "\x1f".join("\x00" if row.get(c) is None else str(row[c]) for c in ATTRIBUTES)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def staged_schema():
    """A staged batch: the source's rows, typed, with the line (or row number) each came from."""
    import pyarrow as pa

    return pa.schema([(c, pa.string()) for c in COLUMNS] + [("source_line", pa.int64())])


def dimension_schema():
    """``dim_merchant``: one row per merchant and version of its attributes (SCD type 2). ``valid_to`` is null
    and ``is_current`` true for the current version (dbt snapshots' convention); ``load_id`` names the load that
    opened the version."""
    import pyarrow as pa

    ts = pa.timestamp("us", tz="UTC")
    return pa.schema([(c, pa.string()) for c in COLUMNS]
                     + [("attr_hash", pa.string()), ("valid_from", ts), ("valid_to", ts),
                        ("is_current", pa.bool_()), ("load_id", pa.string())])
