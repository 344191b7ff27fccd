"""Data Docs that open anywhere, with no internet: the scripts, styles and fonts Great
Expectations' pages load from CDNs are bundled next to the pages.

GX writes HTML that loads jQuery, Bootstrap, bootstrap-table, Font Awesome and Vega from
public CDNs: behind a firewall, or in this project's offline tests, its tables stay empty.
:data:`ASSETS` maps each of those URLs to a file of a pinned npm package; ``make venv``
fetches the packages once (``python -m pipeline.validate.datadocs fetch``, with npm) into
``pipeline/validate/assets/`` (package data: a wheel built after that carries them; or
``CDR_DOCS_ASSETS``), and :func:`bundle` copies the files into
the site's ``static/vendor/`` and points every page at them. Without the packages the
pages keep their CDN links (and a warning says so).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

ASSETS_DIR = Path(os.environ.get("CDR_DOCS_ASSETS", Path(__file__).resolve().parent / "assets"))

#: npm package -> the files the pages need (paths inside the package)
PACKAGES = {
    "jquery@3.7.1": ["dist/jquery.min.js"],
    "popper.js@1.12.9": ["dist/umd/popper.min.js"],
    "bootstrap@4.3.1": ["dist/js/bootstrap.min.js", "dist/css/bootstrap.min.css"],
    "bootstrap-table@1.19.1": [
        "dist/bootstrap-table.min.js",
        "dist/bootstrap-table.min.css",
        "dist/extensions/filter-control/bootstrap-table-filter-control.min.js",
        "dist/extensions/filter-control/bootstrap-table-filter-control.min.css",
    ],
    "bootstrap-datepicker@1.9.0": [
        "dist/js/bootstrap-datepicker.min.js",
        "dist/css/bootstrap-datepicker.min.css",
    ],
    "@fortawesome/fontawesome-free@6.6.0": ["css/all.min.css", "webfonts/"],
    "@forevolve/bootstrap-dark@1.1.0": ["dist/css/bootstrap-prefers-dark.css"],
    "vega@5.33.1": ["build/vega.min.js"],
    "vega-lite@5.23.0": ["build/vega-lite.min.js"],
    "vega-embed@6.29.0": ["build/vega-embed.min.js"],
}

#: a CDN URL the pages load (a regular expression) -> the bundled file
ASSETS = {
    r"https://code\.jquery\.com/jquery-3\.7\.1\.min\.js": "jquery/dist/jquery.min.js",
    r"https://cdnjs\.cloudflare\.com/ajax/libs/popper\.js/1\.12\.9/umd/popper\.min\.js": (
        "popper.js/dist/umd/popper.min.js"
    ),
    r"https://stackpath\.bootstrapcdn\.com/bootstrap/4\.3\.1/js/bootstrap\.min\.js": (
        "bootstrap/dist/js/bootstrap.min.js"
    ),
    r"https://maxcdn\.bootstrapcdn\.com/bootstrap/4\.3\.1/css/bootstrap\.min\.css": (
        "bootstrap/dist/css/bootstrap.min.css"
    ),
    r"https://unpkg\.com/bootstrap-table@1\.19\.1/dist/bootstrap-table\.min\.js": (
        "bootstrap-table/dist/bootstrap-table.min.js"
    ),
    r"https://unpkg\.com/bootstrap-table@1\.19\.1/dist/bootstrap-table\.min\.css": (
        "bootstrap-table/dist/bootstrap-table.min.css"
    ),
    r"https://unpkg\.com/bootstrap-table@1\.19\.[01]/dist/extensions/filter-control/"
    r"bootstrap-table-filter-control(\.min)?\.js": (
        "bootstrap-table/dist/extensions/filter-control/bootstrap-table-filter-control.min.js"
    ),
    r"https://unpkg\.com/bootstrap-table@1\.19\.[01]/dist/extensions/filter-control/"
    r"bootstrap-table-filter-control(\.min)?\.css": (
        "bootstrap-table/dist/extensions/filter-control/bootstrap-table-filter-control.min.css"
    ),
    r"https://cdnjs\.cloudflare\.com/ajax/libs/bootstrap-datepicker/1\.9\.0/js/"
    r"bootstrap-datepicker\.min\.js": "bootstrap-datepicker/dist/js/bootstrap-datepicker.min.js",
    r"https://cdnjs\.cloudflare\.com/ajax/libs/bootstrap-datepicker/1\.9\.0/css/"
    r"bootstrap-datepicker\.min\.css": "bootstrap-datepicker/dist/css/bootstrap-datepicker.min.css",
    r"https://cdnjs\.cloudflare\.com/ajax/libs/font-awesome/6\.6\.0/css/all\.min\.css": (
        "@fortawesome/fontawesome-free/css/all.min.css"
    ),
    r"https://cdn\.jsdelivr\.net/npm/@forevolve/bootstrap-dark@1\.1\.0/dist/css/"
    r"bootstrap-prefers-dark\.css": "@forevolve/bootstrap-dark/dist/css/bootstrap-prefers-dark.css",
    r"https://cdn\.jsdelivr\.net/npm/vega@5": "vega/build/vega.min.js",
    r"https://cdn\.jsdelivr\.net/npm/vega-lite@5": "vega-lite/build/vega-lite.min.js",
    r"https://cdn\.jsdelivr\.net/npm/vega-embed@6": "vega-embed/build/vega-embed.min.js",
}
_LINK = re.compile(r'(src|href)="(https://[^"]+)"')
_LOGO = re.compile(r'src="https://great-expectations-web-assets\.[^"]+"')


def _package_dir(spec: str) -> str:
    return spec.rsplit("@", 1)[0]


def fetch(dest: Path) -> None:
    """Download the pinned packages with ``npm pack`` and keep the files the pages need."""
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            ["npm", "pack", "--silent", "--pack-destination", tmp, *PACKAGES],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        tarballs = sorted(Path(tmp).glob("*.tgz"))
        staging = Path(tmp) / "out"
        for spec, files in PACKAGES.items():
            name = _package_dir(spec)
            stem = name.lstrip("@").replace("/", "-") + "-" + spec.rsplit("@", 1)[1]
            (tarball,) = [t for t in tarballs if t.name == f"{stem}.tgz"]
            with tarfile.open(tarball) as tar:
                for m in tar.getmembers():
                    inner = m.name.removeprefix("package/")
                    wanted = any(
                        inner == f or (f.endswith("/") and inner.startswith(f)) for f in files
                    )
                    if m.isfile() and wanted:
                        m.name = inner
                        tar.extract(m, staging / name, filter="data")
        if dest.exists():
            shutil.rmtree(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(staging, dest)


def available(assets: Path = ASSETS_DIR) -> bool:
    return all((assets / f).exists() for f in ASSETS.values())


def bundle(site: Path, assets: Path = ASSETS_DIR) -> bool:
    """Copy the bundled files into ``site/static/vendor`` and point every page of the
    site at them. Returns False (pages unchanged) when the packages were not fetched."""
    if not available(assets):
        log.warning(
            "Data Docs load their scripts from public CDNs: %s is missing (make docs-assets)",
            assets,
        )
        return False
    vendor = site / "static" / "vendor"
    if vendor.exists():
        shutil.rmtree(vendor)
    shutil.copytree(assets, vendor)
    patterns = [(re.compile(p), f) for p, f in ASSETS.items()]
    logo = site / "static" / "images" / "logo-long-vector.svg"
    for page in site.rglob("*.html"):
        up = os.path.relpath(site, page.parent)

        def local(m: re.Match[str], up: str = up) -> str:
            for pattern, f in patterns:
                if pattern.fullmatch(m.group(2)):
                    return f'{m.group(1)}="{up}/static/vendor/{f}"'
            return m.group(0)

        html = _LINK.sub(local, page.read_text())
        if logo.exists():
            html = _LOGO.sub(f'src="{up}/static/images/{logo.name}"', html)
        page.write_text(html)
    return True


def digests(site: Path) -> dict[str, str]:
    """Every file of a written site (its path inside the site -> its sha256): the run's
    report lists them, and the Data Docs server serves these files, with these contents,
    and no other (``plugins/cdr_plugin.py``)."""

    if not site.is_dir():
        return {}
    return {
        f.relative_to(site).as_posix(): hashlib.sha256(f.read_bytes()).hexdigest()
        for f in sorted(site.rglob("*"))
        if f.is_file()
    }


if __name__ == "__main__":  # python -m pipeline.validate.datadocs fetch [DEST]
    if len(sys.argv) < 2 or sys.argv[1] != "fetch":
        sys.exit("usage: python -m pipeline.validate.datadocs fetch [DEST]")
    fetch(Path(sys.argv[2]) if len(sys.argv) > 2 else ASSETS_DIR)
