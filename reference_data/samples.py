"""A sample merchants file for the demo and the docs: the generator's merchant ids (``mer-0000`` ...) with
plausible names, category codes, countries and risk levels, the same for the same seed."""
from __future__ import annotations

import csv
import random
from pathlib import Path

from reference_data.merchants import COLUMNS, RISK_LEVELS

__all__ = ["write_sample_merchants"]

_KINDS = (("Grocery", "5411"), ("Fuel", "5541"), ("Books", "5942"), ("Restaurant", "5812"), ("Pharmacy", "5912"),
          ("Electronics", "5732"), ("Airline", "4511"), ("Hotel", "7011"), ("Taxi", "4121"), ("Jewellery", "5944"))
_COUNTRIES = ("US", "GB", "DE", "FR", "NL", "ES", "IT", "CA")


def write_sample_merchants(path: Path, merchants: int = 50, seed: int = 46) -> Path:
    """Write ``merchants`` merchants (ids ``mer-0000`` ...) as CSV to ``path`` (its folder made) -> ``path``."""
    rng = random.Random(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as out:
        writer = csv.writer(out)
        writer.writerow(COLUMNS)
        for i in range(merchants):
            kind, mcc = rng.choice(_KINDS)
            writer.writerow([f"mer-{i:04d}", f"{kind} {i:04d}", mcc, rng.choice(_COUNTRIES),
                             rng.choices(RISK_LEVELS, weights=(8, 3, 1))[0]])
    return path
