"""What a read model is: one spec object per module, collected by the registry in ``read_models``."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

__all__ = ["ReadModel", "CURRENT_STATE_BY_VERSION"]

# Merge strategies. CURRENT_STATE_BY_VERSION: one row per aggregate; a batch's events for a key are
# applied only when they continue the row's version without a gap (v+1, v+2, ...), so duplicates,
# replays and re-runs change nothing and out-of-order events wait until the gap is filled.
CURRENT_STATE_BY_VERSION = "current_state_by_version"


@dataclass(frozen=True)
class ReadModel:
    name: str
    key: str
    event_types: tuple[str, ...]
    # Delta schema (a pyspark StructType), built lazily so importing a read model needs no JVM.
    schema: Callable[[], Any]
    # Vectorised fold: DataFrame of contiguous events (one key, versions first_version..version)
    # -> one row per key of changes, which ``merge_update`` / ``merge_insert`` turn into the new row.
    fold: Callable[[Any], Any]
    merge_update: Mapping[str, str]   # column -> SQL over t (target) and s (folded changes)
    merge_insert: Mapping[str, str]   # column -> SQL over s, for a key seen for the first time
    merge_strategy: str
    # Plain-Python fold of the same events: the test oracle. events -> {key: row dict}.
    python_fold: Callable[[Iterable[Any]], dict[str, dict[str, Any]]]
    description: str = ""

    @property
    def columns(self) -> list[str]:
        return [f.name for f in self.schema().fields]
