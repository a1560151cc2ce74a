"""Data Docs without the internet (issue 46, part 6): every style and script GX's pages load from a CDN is pointed
at the site's own copy, from the cache `eventlake setup` fills (expectations.data_docs_assets); without the cache
the pages are left as GX wrote them, and that is said. Here the cache holds stand-in files: no network."""
from __future__ import annotations

import re
from pathlib import Path

from expectations import data_docs_assets
from expectations.data_docs_assets import ASSETS

LOADS = re.compile(r"""(?:src|href)=["']([^"'#]+)["']|url\(['"]?([^'")]+)['"]?\)""")


def page(links: list[str]) -> str:
    """A page shaped as GX writes them: its heads' links, the navbar's logo, the dark theme's background logo."""
    heads = "".join(f'<link href="{u}" rel="stylesheet">' if u.endswith(".css") else f'<script src="{u}"></script>'
                    for u in links)
    return (f"<html><head>{heads}<style>.logo {{ background: url('https://great-expectations-web-assets.s3.us-east-2"
            f".amazonaws.com/full_logo_dark.png') 0 0 no-repeat; }}</style></head><body>"
            f'<img src="https://great-expectations-web-assets.s3.us-east-2.amazonaws.com/logo-long.png?d=1&x=2">'
            f'<a href="https://greatexpectations.io">GX</a><a href="#top">top</a>'
            # GX's validation pages name the site's favicon one level short of their depth.
            f'<link rel="icon" href="../../../static/images/favicon.ico"></body></html>')


def site_with_pages(tmp_path: Path) -> tuple[Path, list[Path]]:
    site = tmp_path / "data_docs"
    pages = [site / "index.html", site / "expectations" / "payments.html",
             site / "validations" / "payments" / "g0001-v3" / "20261129T000000Z" / "payments.html"]
    for p in pages:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(page([a.url for a in ASSETS]))
    (site / "static" / "images").mkdir(parents=True)
    (site / "static" / "images" / "logo-long.png").write_bytes(b"png")
    (site / "static" / "images" / "favicon.ico").write_bytes(b"ico")
    return site, pages


def test_every_page_loads_its_styles_and_scripts_from_the_site_itself(tmp_path):
    cache = tmp_path / "cache"
    for asset in ASSETS:
        target = data_docs_assets.assets_dir(cache) / asset.local
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(f"/* {asset.url} */")
        for folder in asset.folders:
            (target.parent.parent / folder).mkdir(exist_ok=True)
            (target.parent.parent / folder / "fa-solid-900.woff2").write_bytes(b"font")
    site, pages = site_with_pages(tmp_path)
    said = []
    assert data_docs_assets.localise(site, cache, log=said.append) and not said
    for p in pages:
        loads = [a or b for a, b in LOADS.findall(p.read_text())]
        external = [u for u in loads if u.startswith("http")]
        assert external == ["https://greatexpectations.io"], (p, external)  # a link to follow, nothing loaded
        local = [u for u in loads if not u.startswith("http")]
        assert len(local) == len(ASSETS) + 3, local  # every asset, both logos, the favicon
        for u in local:
            assert (p.parent / u).resolve().is_file(), (p, u)
    fonts = site / "static" / "vendor" / "@fortawesome" / "fontawesome-free@6.6.0" / "webfonts" / "fa-solid-900.woff2"
    assert fonts.is_file()  # what its all.min.css loads, beside it as in the package
    # A second build rewrites the pages again; the copies are made once.
    assert data_docs_assets.localise(site, cache, log=said.append)


def test_without_the_cache_the_pages_are_left_as_gx_wrote_them_and_that_is_said(tmp_path):
    site, pages = site_with_pages(tmp_path)
    before = [p.read_text() for p in pages]
    said = []
    assert not data_docs_assets.localise(site, tmp_path / "empty-cache", log=said.append)
    assert [p.read_text() for p in pages] == before
    assert len(said) == 1 and f"{len(ASSETS)} of their styles and scripts are not in" in said[0] \
        and "eventlake setup" in said[0]
