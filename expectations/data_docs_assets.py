"""Great Expectations' Data Docs without the internet: the styles and scripts its pages load from CDNs, served from
the site itself.

GX's pages link Bootstrap, jQuery, bootstrap-table, Font Awesome, Vega and others from public CDNs; an air-gapped
site (a cluster without internet access, this machine) shows a blank page. ``eventlake setup`` fetches the same
files, pinned, from the npm registry into the cache (``fetch``: each package's tarball, its ``dist.integrity``
checked); after each build, ``localise`` copies them under the site's ``static/vendor`` and points every page's
links there. Without the cache (set-up not run), the pages keep their CDN links, and that is said.
"""
from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import re
import shutil
import tarfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

__all__ = ["Asset", "ASSETS", "REGISTRY", "assets_dir", "fetch", "localise", "missing"]

REGISTRY = os.environ.get("npm_config_registry", "https://registry.npmjs.org").rstrip("/")


@dataclass(frozen=True)
class Asset:
    """A file a Data Docs page loads from ``url``: ``path`` in npm package ``package`` at ``version``; ``folders``:
    what the file itself loads beside it (Font Awesome's fonts)."""
    url: str
    package: str
    version: str
    path: str
    folders: tuple[str, ...] = ()

    @property
    def local(self) -> str:
        """Where it goes under the site's ``static/vendor``."""
        return f"{self.package}@{self.version}/{self.path}"


# What great_expectations 1.x's page template links (render/view/templates/top_navbar.j2 and its heads), each to
# the same version on npm; the bare package URLs of jsDelivr (vega@5 ...) serve the package's "jsdelivr" file.
ASSETS = (
    Asset("https://maxcdn.bootstrapcdn.com/bootstrap/4.3.1/css/bootstrap.min.css", "bootstrap", "4.3.1",
          "dist/css/bootstrap.min.css"),
    Asset("https://stackpath.bootstrapcdn.com/bootstrap/4.3.1/js/bootstrap.min.js", "bootstrap", "4.3.1",
          "dist/js/bootstrap.min.js"),
    Asset("https://cdn.jsdelivr.net/npm/@forevolve/bootstrap-dark@1.1.0/dist/css/bootstrap-prefers-dark.css",
          "@forevolve/bootstrap-dark", "1.1.0", "dist/css/bootstrap-prefers-dark.css"),
    Asset("https://cdnjs.cloudflare.com/ajax/libs/bootstrap-datepicker/1.9.0/css/bootstrap-datepicker.min.css",
          "bootstrap-datepicker", "1.9.0", "dist/css/bootstrap-datepicker.min.css"),
    Asset("https://cdnjs.cloudflare.com/ajax/libs/bootstrap-datepicker/1.9.0/js/bootstrap-datepicker.min.js",
          "bootstrap-datepicker", "1.9.0", "dist/js/bootstrap-datepicker.min.js"),
    Asset("https://cdnjs.cloudflare.com/ajax/libs/font-awesome/6.6.0/css/all.min.css", "@fortawesome/fontawesome-free",
          "6.6.0", "css/all.min.css", folders=("webfonts",)),
    Asset("https://unpkg.com/bootstrap-table@1.19.1/dist/bootstrap-table.min.css", "bootstrap-table", "1.19.1",
          "dist/bootstrap-table.min.css"),
    Asset("https://unpkg.com/bootstrap-table@1.19.1/dist/bootstrap-table.min.js", "bootstrap-table", "1.19.1",
          "dist/bootstrap-table.min.js"),
    Asset("https://unpkg.com/bootstrap-table@1.19.0/dist/extensions/filter-control/"
          "bootstrap-table-filter-control.min.css", "bootstrap-table", "1.19.0",
          "dist/extensions/filter-control/bootstrap-table-filter-control.min.css"),
    Asset("https://unpkg.com/bootstrap-table@1.19.0/dist/extensions/filter-control/"
          "bootstrap-table-filter-control.css", "bootstrap-table", "1.19.0",
          "dist/extensions/filter-control/bootstrap-table-filter-control.css"),
    Asset("https://unpkg.com/bootstrap-table@1.19.1/dist/extensions/filter-control/"
          "bootstrap-table-filter-control.min.js", "bootstrap-table", "1.19.1",
          "dist/extensions/filter-control/bootstrap-table-filter-control.min.js"),
    Asset("https://cdnjs.cloudflare.com/ajax/libs/popper.js/1.12.9/umd/popper.min.js", "popper.js", "1.12.9",
          "dist/umd/popper.min.js"),
    Asset("https://code.jquery.com/jquery-3.7.1.min.js", "jquery", "3.7.1", "dist/jquery.min.js"),
    Asset("https://cdn.jsdelivr.net/npm/vega@5", "vega", "5.33.1", "build/vega.min.js"),
    Asset("https://cdn.jsdelivr.net/npm/vega-lite@5", "vega-lite", "5.23.0", "build/vega-lite.min.js"),
    Asset("https://cdn.jsdelivr.net/npm/vega-embed@6", "vega-embed", "6.29.0", "build/vega-embed.min.js"),
)
# GX's logos, from its web assets bucket (the navbar's with a per-build query string, the dark theme's as a CSS
# background): the copy in the site's own static/images.
_LOGO = re.compile(r"https://great-expectations-web-assets\.s3\.[a-z0-9-]+\.amazonaws\.com/[\w-]+\.png[^\"')]*")


_OWN_STATIC = re.compile(r"""((?:src|href)=["'])(?:\.\./)*static/""")


def assets_dir(cache_dir: Path) -> Path:
    return cache_dir / "data-docs-assets"


def missing(cache_dir: Path) -> list[Asset]:
    """The assets not in the cache yet."""
    root = assets_dir(cache_dir)
    return [a for a in ASSETS if not (root / a.local).is_file()]


def _tarball(package: str, version: str) -> tuple[str, str]:
    """(the tarball's URL, its integrity string) from the registry's metadata of ``package`` at ``version``."""
    with urllib.request.urlopen(f"{REGISTRY}/{package.replace('/', '%2F')}/{version}", timeout=60) as response:
        dist = json.loads(response.read())["dist"]
    return dist["tarball"], dist["integrity"]


def _check_integrity(data: bytes, integrity: str, what: str) -> None:
    algorithm, _, expected = integrity.partition("-")
    got = base64.b64encode(hashlib.new(algorithm, data).digest()).decode()
    if got != expected:
        raise ValueError(f"{what}: its {algorithm} is not the registry's ({integrity}); not used")


def fetch(cache_dir: Path, log: Callable[[str], None] = print) -> int:
    """Fetch the assets the cache lacks (each package's tarball once, its integrity checked) -> files written."""
    root = assets_dir(cache_dir)
    wanted: dict[tuple[str, str], list[Asset]] = {}
    for asset in missing(cache_dir):
        wanted.setdefault((asset.package, asset.version), []).append(asset)
    written = 0
    for (package, version), assets in sorted(wanted.items()):
        url, integrity = _tarball(package, version)
        with urllib.request.urlopen(url, timeout=120) as response:
            data = response.read()
        _check_integrity(data, integrity, f"{package}@{version}")
        paths = {a.path for a in assets}
        folders = tuple(f"{os.path.dirname(a.path)}/../{f}".lstrip("/") for a in assets for f in a.folders)
        folders = tuple(os.path.normpath(f) for f in folders)
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            for member in tar.getmembers():
                inner = member.name.split("/", 1)[1] if "/" in member.name else ""
                if not member.isfile() or not (inner in paths or any(inner.startswith(f + "/") for f in folders)):
                    continue
                target = root / f"{package}@{version}" / inner
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(tar.extractfile(member).read())
                written += 1
    if wanted:
        log(f"setup: Data Docs' styles and scripts ({len(wanted)} npm packages) ready in {root}")
    return written


def localise(site: Path, cache_dir: Path, log: Callable[[str], None] = print) -> bool:
    """Copy the cached assets under ``site/static/vendor`` and point every page of ``site`` at them (and at the
    site's own logo). -> whether the pages now load nothing from the internet; False (the pages untouched) when
    the cache lacks an asset."""
    lacking = missing(cache_dir)
    if lacking:
        log(f"data docs: {len(lacking)} of their styles and scripts are not in {assets_dir(cache_dir)} (run "
            f"`eventlake setup`): the pages load them from the internet")
        return False
    root, vendor = assets_dir(cache_dir), site / "static" / "vendor"
    for asset in ASSETS:
        target = vendor / asset.local
        if not target.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(root / asset.local, target)
            for folder in asset.folders:
                source = (root / asset.local).parent.parent / folder
                shutil.copytree(source, target.parent.parent / folder, dirs_exist_ok=True)
    for page in site.rglob("*.html"):
        text = page.read_text(encoding="utf-8")
        up = os.path.relpath(site, page.parent)
        changed = text
        for asset in ASSETS:
            changed = changed.replace(f'"{asset.url}"', f'"{up}/static/vendor/{asset.local}"')
        changed = _LOGO.sub(f"{up}/static/images/logo-long.png", changed)
        # The site's own files at the page's depth (GX's validation pages name the favicon one level short).
        changed = _OWN_STATIC.sub(lambda m: f'{m.group(1)}{up}/static/', changed)
        if changed != text:
            page.write_text(changed, encoding="utf-8")
    return True
