"""Read models of the site domain (the ``site`` aggregate: a website and its page views), one module per table.

``MODELS`` collects them; ``read_models.REGISTRY`` includes them (docs/DESIGN.md, "Adding a domain").
"""
from __future__ import annotations

from read_models.site.page_minute_clicks import MODEL as PAGE_MINUTE_CLICKS
from read_models.spec import ReadModel

__all__ = ["MODELS", "PAGE_MINUTE_CLICKS"]

MODELS: dict[str, ReadModel] = {m.name: m for m in (PAGE_MINUTE_CLICKS,)}
