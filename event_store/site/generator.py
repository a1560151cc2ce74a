"""The site domain's data generator: sites and their page views, some of them late, with a retired site and an
unknown one for the site aggregate's rejections (see :class:`SiteGeneratorConfig`); deterministic for a given seed
and ``start``."""
from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Iterator

from event_store.envelope import format_time
from event_store.generated import command_records
from event_store.site import schemas as site_schemas

__all__ = ["SiteGeneratorConfig", "generate_site_commands", "records_for_cli"]


@dataclass(frozen=True)
class SiteGeneratorConfig:
    """Web traffic: ``sites`` registered at ``start``, ``views`` page views over ``pages`` pages by ``visitors``
    visitors spread over ``minutes`` of event time (a few pages and visitors draw most views), and these
    deliberate cases:

    - ``late_rate``: the share of views that arrive 1 to 10 minutes after they happened (a tracker's retry);
    - one site retired at two thirds of the span (``retire``), with one more view sent after (rejected
      ``SiteNotActive``); the views before stay counted;
    - ``unknown_site_views`` for a site never registered (rejected ``SiteNotFound``).
    """
    sites: int = 3
    pages: int = 8
    visitors: int = 60
    views: int = 600
    minutes: int = 10
    seed: int = 42
    run_id: str = "demo"           # prefixes site ids, so several runs can share one log
    start: datetime = datetime(2026, 1, 1, tzinfo=timezone.utc)
    late_rate: float = 0.02
    retire: bool = True
    unknown_site_views: int = 2


def generate_site_commands(cfg: SiteGeneratorConfig) -> Iterator[tuple[str, bytes]]:
    """(Kafka key, command JSON) pairs in arrival order: every site is registered before its views arrive. Every
    command is valid against the site domain's schemas; the rejections are the deliberate cases of ``cfg``."""
    if cfg.sites < 1 or cfg.pages < 1 or cfg.visitors < 1 or cfg.minutes < 1:
        raise ValueError(f"SiteGeneratorConfig: sites, pages, visitors and minutes must be at least 1 ({cfg})")
    rng = random.Random(cfg.seed)
    span = timedelta(minutes=cfg.minutes)
    sites = [f"web-{cfg.run_id}-{i:02d}" for i in range(cfg.sites)]
    pages = ["/"] + [f"/{name}" for name in ("pricing", "docs/start", "docs/sql", "blog", "blog/launch", "about",
                                              "careers", "contact", "status")][:max(cfg.pages - 1, 0)]
    pages += [f"/page/{i}" for i in range(len(pages), cfg.pages)]
    page_weights = [1 / (rank + 1) for rank in range(len(pages))]  # a few pages draw most views
    visitors = [f"vis-{cfg.run_id}-{i:05d}" for i in range(cfg.visitors)]
    retired = sites[-1] if cfg.retire else None
    retire_at = cfg.start + span * 2 / 3
    stream: list[tuple[datetime, int, str, str, dict]] = []

    def add(arrival: datetime, site: str, kind: str, payload: dict) -> None:
        stream.append((arrival, len(stream), site, kind, payload))

    for i, site in enumerate(sites):
        add(cfg.start + timedelta(milliseconds=10 * i), site, "RegisterSite",
            {"site_name": f"Site {i} of run {cfg.run_id}", "host": f"site{i}.{cfg.run_id}.example.com"})
    for n in range(cfg.views):
        site = rng.choice(sites)
        viewed = cfg.start + timedelta(seconds=1 + rng.uniform(0, span.total_seconds() - 2))
        if site == retired and viewed >= retire_at:
            site = sites[0]  # the retired site's only view after its retirement is the deliberate case below
        arrival = viewed
        if rng.random() < cfg.late_rate and site != retired:
            arrival = viewed + timedelta(seconds=rng.randint(60, 600))
        add(arrival, site, "RecordPageView", {
            "view_id": f"view-{cfg.run_id}-{n:07d}", "page": rng.choices(pages, weights=page_weights)[0],
            "visitor_id": rng.choice(visitors), "viewed_at": format_time(viewed)})
    if retired is not None:
        add(retire_at, retired, "RetireSite", {"reason": "moved to another host"})
        after = retire_at + timedelta(seconds=5)
        add(after, retired, "RecordPageView", {"view_id": f"view-{cfg.run_id}-after-retirement", "page": "/",
                                               "visitor_id": visitors[0], "viewed_at": format_time(after)})
    for i in range(cfg.unknown_site_views):
        t = cfg.start + timedelta(seconds=rng.uniform(60, span.total_seconds() / 2))
        add(t, f"web-{cfg.run_id}-unknown-{i:02d}", "RecordPageView", {
            "view_id": f"view-{cfg.run_id}-unknown-{i:02d}", "page": "/", "visitor_id": visitors[0],
            "viewed_at": format_time(t)})

    yield from command_records(stream, "site", site_schemas.COMMANDS, random.Random(f"site/{cfg.run_id}/{cfg.seed}"))


def records_for_cli(settings, args) -> tuple[list, str]:
    """``eventlake generate --domain site``: event times end at about now."""
    start = datetime.now(timezone.utc) - timedelta(minutes=args.minutes + 10)
    records = list(generate_site_commands(SiteGeneratorConfig(sites=args.sites, views=args.views,
                                                              minutes=args.minutes, seed=args.seed,
                                                              run_id=args.run_id, start=start)))
    return records, f"{args.sites} sites"
