"""Read models of the IoT telemetry domain (the ``device`` aggregate), one module per table.

``MODELS`` collects them; ``read_models.REGISTRY`` includes them (docs/DESIGN.md, "Adding a domain").
"""
from __future__ import annotations

from read_models.iot.device_minute_readings import MODEL as DEVICE_MINUTE_READINGS
from read_models.iot.device_status import MODEL as DEVICE_STATUS
from read_models.iot.telemetry_anomalies import MODEL as TELEMETRY_ANOMALIES
from read_models.spec import ReadModel

__all__ = ["MODELS", "DEVICE_STATUS", "DEVICE_MINUTE_READINGS", "TELEMETRY_ANOMALIES"]

MODELS: dict[str, ReadModel] = {m.name: m for m in (DEVICE_STATUS, DEVICE_MINUTE_READINGS, TELEMETRY_ANOMALIES)}
