"""Great Expectations suites of the IoT telemetry domain's read models (``read_models.iot``), one module each,
in the shape of ``expectations``' own (``TABLE``, ``expectations(gx)``, optionally ``derived_columns(df)``).

``SUITES`` collects them; ``expectations.SUITES`` includes them (docs/DESIGN.md, "Adding a domain"). The domain
has no cross-model check (``CROSS_MODEL_CHECKS``: see ``expectations.account``).
"""
from __future__ import annotations

from types import ModuleType

from expectations.cross_model import CrossModelCheck
from expectations.iot import device_minute_readings, device_status, telemetry_anomalies

__all__ = ["SUITES", "CROSS_MODEL_CHECKS"]

SUITES: dict[str, ModuleType] = {m.TABLE: m for m in (device_status, device_minute_readings, telemetry_anomalies)}
CROSS_MODEL_CHECKS: dict[str, CrossModelCheck] = {}
