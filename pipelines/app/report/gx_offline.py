"""GX's Data Docs made to work from disk: the scripts, stylesheets and fonts its pages load from
public CDNs are vendored in ``gx_vendor/`` (from npm, at the versions GX's templates name, each
with its license), copied into the site and linked by relative paths.

GX has no setting for those URLs (they are literal in its templates, and its own template folder
is searched before a custom one), so the written pages are rewritten after GX builds them. The
versions are GX 1.24's; a GX release naming others is logged, and the report's browser test fails.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from pathlib import Path

log = logging.getLogger(__name__)

VENDOR = Path(__file__).with_name("gx_vendor")

#: Each CDN URL GX's pages load -> its file under ``gx_vendor/`` (npm package@version: path).
ASSETS = {
    # vega@5.33.1: build/vega.min.js (what jsDelivr's floating @5 served when vendored)
    "https://cdn.jsdelivr.net/npm/vega@5": "vega/vega.min.js",
    # vega-lite@5.23.0: build/vega-lite.min.js
    "https://cdn.jsdelivr.net/npm/vega-lite@5": "vega-lite/vega-lite.min.js",
    # vega-embed@6.29.0: build/vega-embed.min.js
    "https://cdn.jsdelivr.net/npm/vega-embed@6": "vega-embed/vega-embed.min.js",
    # @fortawesome/fontawesome-free@6.6.0: css/all.min.css (its webfonts/*.woff2 beside it)
    "https://cdnjs.cloudflare.com/ajax/libs/font-awesome/6.6.0/css/all.min.css": "fontawesome/css/all.min.css",
    # jquery@3.7.1: dist/jquery.min.js
    "https://code.jquery.com/jquery-3.7.1.min.js": "jquery/jquery.min.js",
    # popper.js@1.12.9: dist/umd/popper.min.js (the SRI hash in GX's tag matches it)
    "https://cdnjs.cloudflare.com/ajax/libs/popper.js/1.12.9/umd/popper.min.js": "popper/popper.min.js",
    # bootstrap@4.3.1: dist/js/bootstrap.min.js (SRI hash matches), dist/css/bootstrap.min.css
    "https://stackpath.bootstrapcdn.com/bootstrap/4.3.1/js/bootstrap.min.js": "bootstrap/bootstrap.min.js",
    "https://maxcdn.bootstrapcdn.com/bootstrap/4.3.1/css/bootstrap.min.css": "bootstrap/bootstrap.min.css",
    # bootstrap-table@1.19.1: dist/ and dist/extensions/filter-control/ (GX names 1.19.0 for the
    # filter control's stylesheet; 1.19.1's holds the same rules)
    "https://unpkg.com/bootstrap-table@1.19.1/dist/bootstrap-table.min.js": "bootstrap-table/bootstrap-table.min.js",
    "https://unpkg.com/bootstrap-table@1.19.1/dist/bootstrap-table.min.css": "bootstrap-table/bootstrap-table.min.css",
    "https://unpkg.com/bootstrap-table@1.19.1/dist/extensions/filter-control/bootstrap-table-filter-control.min.js": (
        "bootstrap-table/bootstrap-table-filter-control.min.js"
    ),
    "https://unpkg.com/bootstrap-table@1.19.0/dist/extensions/filter-control/bootstrap-table-filter-control.css": (
        "bootstrap-table/bootstrap-table-filter-control.min.css"
    ),
    "https://unpkg.com/bootstrap-table@1.19.0/dist/extensions/filter-control/bootstrap-table-filter-control.min.css": (
        "bootstrap-table/bootstrap-table-filter-control.min.css"
    ),
    # bootstrap-datepicker@1.9.0: dist/js/ and dist/css/
    "https://cdnjs.cloudflare.com/ajax/libs/bootstrap-datepicker/1.9.0/js/bootstrap-datepicker.min.js": (
        "bootstrap-datepicker/bootstrap-datepicker.min.js"
    ),
    "https://cdnjs.cloudflare.com/ajax/libs/bootstrap-datepicker/1.9.0/css/bootstrap-datepicker.min.css": (
        "bootstrap-datepicker/bootstrap-datepicker.min.css"
    ),
    # @forevolve/bootstrap-dark@1.1.0: dist/css/bootstrap-prefers-dark.min.css (the same rules as
    # the unminified file GX names, 153 KB instead of 883 KB)
    "https://cdn.jsdelivr.net/npm/@forevolve/bootstrap-dark@1.1.0/dist/css/bootstrap-prefers-dark.css": (
        "bootstrap-dark/bootstrap-prefers-dark.min.css"
    ),
}

#: GX's logo, loaded from its S3 bucket with the time and the context's id on each page view (the
#: light logo ships in the site's own ``static/images``; the dark one does not, and takes it too).
_LOGOS = re.compile(
    r"https://great-expectations-web-assets\.s3\.us-east-2\.amazonaws\.com/(?:logo-long|full_logo_dark)\.png[^\"')\s]*"
)
#: A subresource hash and CORS mode on a ``<script>``: a browser refuses both for a file:// page.
_SRI = re.compile(r'\s+integrity="sha\d+-[^"]+"(\s+crossorigin="[^"]*")?')
_SITE_STATIC = re.compile(r'(?<=")(?:\.\./)*static/')
_REMOTE = re.compile(r'<(?:script|link|img)\b[^>]*?\b(?:src|href)="(https?://[^"]+)"')


def make_offline(site: Path) -> None:
    """Copy the vendored assets into ``site/static/vendor`` and point every page of the site at
    them; a page that still loads something from the network (a GX release naming new URLs) is
    logged as a warning."""
    shutil.copytree(VENDOR, site / "static" / "vendor", dirs_exist_ok=True)
    for page in site.rglob("*.html"):
        up = os.path.relpath(site, page.parent).replace(os.sep, "/")
        html = page.read_text(encoding="utf-8")
        for url, path in ASSETS.items():
            html = html.replace(f'"{url}"', f'"{up}/static/vendor/{path}"')
        html = _SRI.sub("", _LOGOS.sub(f"{up}/static/images/logo-long.png", html))
        # The site's own files from this page's folder (GX's validation pages link their favicon
        # one folder short).
        html = _SITE_STATIC.sub(f"{up}/static/", html)
        remote = _REMOTE.findall(html)
        if remote:
            log.warning("%s still loads %s: not vendored in %s", page, ", ".join(sorted(set(remote))), VENDOR)
        page.write_text(html, encoding="utf-8")
