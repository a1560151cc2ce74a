"""Read models of the site domain (the ``site`` aggregate: a website and its page views), one module per table.

``MODELS`` collects them. They are not in ``read_models.REGISTRY`` yet: the domain is registered in
``event_store.domains`` together with the other new domains once their Spark folds have run end to end
(docs/DESIGN.md, "Adding a domain"); the models' registration follows the domain's.
"""
from __future__ import annotations

from read_models.site.page_minute_clicks import MODEL as PAGE_MINUTE_CLICKS
from read_models.spec import ReadModel

__all__ = ["MODELS", "PAGE_MINUTE_CLICKS"]

MODELS: dict[str, ReadModel] = {m.name: m for m in (PAGE_MINUTE_CLICKS,)}
