"""Personal data unsealed on Spark, vectorised (issue 45, docs/forgetting.md): the Spark readers' twin of
``event_store.sealing.Unsealer``.

A token is ``elk1:<subject, base64url>:<field>:<base64url of nonce (12 bytes) + ciphertext + GCM tag (16 bytes)>``
(``event_store.personal_data``), which is the layout Spark's built-in ``aes_decrypt(..., 'GCM', 'DEFAULT', aad)``
reads. Per DataFrame, once the home's key store knows a subject (sealing was on at some time): one small job finds
the subjects its tokens name, the driver looks their keys up in the key store (``SubjectKeys.key_of``: a forgotten
subject has none; an unknown one is an error, never a null), and those keys, with each subject's associated data per
field, go to the executors as a broadcast join. Every personal column is then decrypted by Spark's own functions: no
Python per row. A forgotten subject's values become null; a token that does not authenticate or sits in another
column than its field is an error that fails the job, naming it. With an empty key store (sealing never on, the
default) no job runs: a token is an error inside the fold's own job.
Plain values (events written with sealing off) pass through as they are.
"""
from __future__ import annotations

import base64
from typing import NamedTuple

from event_store.personal_data import TOKEN_PREFIX, associated_data
from event_store.sealing import Unsealer, personal_columns

__all__ = ["unsealed"]

_SUBJECT = "_elk_subject"


def unsealed(df, unsealer: Unsealer):
    """``df`` (event rows) with the tokens of its personal columns unsealed (module docstring); ``df`` itself when
    it has no personal column or no token."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import BinaryType, StringType, StructField, StructType

    columns = sorted(personal_columns().intersection(df.columns))
    if not columns:
        return df
    keys = unsealer.keys
    unsealer.refresh()
    if not len(keys):
        # A home that never sealed a value (sealing off, the default): no subject to look up, so no job to find
        # them; a token here can only be another home's or forged, an error in the fold's own job.
        return df.withColumns({c: _expressions(c, str(keys.path), F).unknown for c in columns})
    named = F.array_distinct(F.array(*[_expressions(c, str(keys.path), F).subject for c in columns]))
    subjects = [r[0] for r in df.select(F.explode(named).alias("s")).where("s IS NOT NULL").distinct().collect()]
    if not subjects:
        return df
    rows = []
    for encoded in subjects:
        subject = _subject(encoded)
        key = unsealer.keys.key_of(subject)
        rows.append((encoded, key, *[associated_data(subject, c) for c in columns]))
    schema = StructType([StructField(_SUBJECT, StringType()), StructField("_elk_key", BinaryType()),
                         *[StructField(f"_elk_aad_{c}", BinaryType()) for c in columns]])
    keys = F.broadcast(df.sparkSession.createDataFrame(rows, schema))
    out = df
    for c in columns:
        x = _expressions(c, str(unsealer.keys.path), F)
        side = keys.select(F.col(_SUBJECT).alias(f"{_SUBJECT}_{c}"), F.col("_elk_key").alias(f"_elk_key_{c}"),
                           F.col(f"_elk_aad_{c}").alias(f"_elk_aad_{c}"))
        out = (out.join(side, x.subject == F.col(f"{_SUBJECT}_{c}"), "left")
               .withColumn(f"_elk_plain_{c}", x.plain).withColumn(c, x.opened)
               .drop(f"{_SUBJECT}_{c}", f"_elk_key_{c}", f"_elk_aad_{c}", f"_elk_plain_{c}"))
    return out


class _Expressions(NamedTuple):
    """One personal column's unsealing, as Columns (unresolved expressions: the same for every DataFrame)."""
    unknown: object  # the column with a token refused: the key store knows no subject
    subject: object  # a token's subject (base64url), null for a plain value
    plain: object  # the token's plaintext (JSON), decrypted with the joined key and associated data
    opened: object  # the column's value as the folds read it (over the joined key and ``plain``)


# (Spark context, column, key store path) -> its _Expressions. Building them is tens of calls into the JVM per
# column (a parse of a SQL expression among them), in every micro-batch of every read model's fold: built once.
_EXPRESSIONS: dict[tuple, _Expressions] = {}


def _expressions(c: str, keys_path: str, F) -> _Expressions:
    from pyspark import SparkContext

    context = SparkContext._active_spark_context
    if any(k[0] is not context for k in _EXPRESSIONS):
        _EXPRESSIONS.clear()
    cached = _EXPRESSIONS.get((context, c, keys_path))
    if cached is not None:
        return cached
    parts = F.split(F.col(c), ":")
    token = F.col(c).startswith(TOKEN_PREFIX)
    unknown = F.when(token, F.raise_error(F.concat(
        F.lit(f"field '{c}': a sealed value of subject "), parts.getItem(1),
        F.lit(f" (base64url), and the key store {keys_path} knows no subject (another home's token, or a lost "
              f"key store)"))).cast("string")).otherwise(F.col(c))
    # base64url without padding -> base64 with it, for unbase64.
    sealed = F.unbase64(F.expr(f"rpad(translate(split(`{c}`, ':')[3], '-_', '+/'), "
                               f"cast(ceil(length(split(`{c}`, ':')[3]) / 4) * 4 AS INT), '=')"))
    key, aad = F.col(f"_elk_key_{c}"), F.col(f"_elk_aad_{c}")
    plain = F.try_aes_decrypt(sealed, key, F.lit("GCM"), F.lit("DEFAULT"), aad)
    value = F.get_json_object(F.concat(F.lit('{"v":'), F.col(f"_elk_plain_{c}").cast("string"), F.lit("}")), "$.v")
    refused = F.raise_error(F.concat(
        F.lit(f"field '{c}': a sealed value of subject "), F.col(f"{_SUBJECT}_{c}"),
        F.lit(" (base64url) does not authenticate or was sealed for another field (tampered with, corrupt or "
              "moved)")))
    opened = (F.when(~token | F.col(c).isNull(), F.col(c))
              .when(key.isNull(), F.lit(None).cast("string"))  # forgotten
              .when(parts.getItem(2) != F.lit(c), refused.cast("string"))
              .when(F.col(f"_elk_plain_{c}").isNull(), refused.cast("string"))
              .otherwise(value))
    cached = _EXPRESSIONS[(context, c, keys_path)] = _Expressions(
        unknown, F.when(token, parts.getItem(1)), plain, opened)
    return cached


def _subject(encoded: str) -> str:
    try:
        return base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode("utf-8")
    except (ValueError, UnicodeDecodeError):
        from event_store.personal_data import SealedValueError

        raise SealedValueError(f"a sealed value names subject {encoded!r}, which is not base64url of a subject "
                               f"id (corrupt)") from None
