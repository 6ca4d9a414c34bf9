"""``/docs``: Swagger UI served from an installed package, so it works offline and behind firewalls.

FastAPI's default page loads Swagger UI from a CDN and is blank without internet access. The
assets come from ``swagger-ui-bundle-v2`` (the maintained fork of ``swagger-ui-bundle``; both
install the ``swagger_ui_bundle`` module). Swagger UI 5 or newer is needed for FastAPI's OpenAPI 3.1
documents; without it ``/docs`` says what to install and links the raw ``/openapi.json``. Nothing
is ever loaded from another host.
"""

from __future__ import annotations

import html
import importlib
import logging
import os
import re
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

__all__ = ["ASSETS_URL", "ASSET_FILES", "INSTALL_HINT", "mount_docs", "swagger_ui_assets"]

log = logging.getLogger(__name__)

ASSETS_URL = "/docs/assets"
INSTALL_HINT = "pip install 'swagger-ui-bundle-v2>=5'"
#: The only files the page needs; the bundle's other files (maps, ES modules) are not served.
ASSET_FILES = ("swagger-ui-bundle.js", "swagger-ui.css", "favicon-32x32.png")


def swagger_ui_assets() -> Path | None:
    """The installed Swagger UI (version 5+) asset directory, or None."""
    try:
        bundle = importlib.import_module("swagger_ui_bundle")  # untyped: no stubs to import
    except ImportError:
        return None
    path = Path(str(getattr(bundle, "swagger_ui_path", "")))
    match = re.search(r"(\d+)\.", path.name)
    if match is None or int(match[1]) < 5:
        log.warning("Swagger UI %s cannot show OpenAPI 3.1 documents; %s", path.name, INSTALL_HINT)
        return None
    if not all((path / name).is_file() for name in ASSET_FILES):
        return None
    return path


class _OnlyAssets(StaticFiles):
    """Static files restricted to :data:`ASSET_FILES`."""

    def lookup_path(self, path: str) -> tuple[str, os.stat_result | None]:
        if path.lstrip("/") not in ASSET_FILES:
            return "", None
        return super().lookup_path(path)


def mount_docs(app: FastAPI, *, docs_url: str = "/docs") -> bool:
    """Add the offline Swagger UI page at *docs_url* (create the app with ``docs_url=None,
    redoc_url=None``). Returns whether the assets were found."""
    assets = swagger_ui_assets()
    openapi_url = app.openapi_url or "/openapi.json"
    if assets is not None:
        app.mount(ASSETS_URL, _OnlyAssets(directory=str(assets)), name="docs-assets")

    @app.get(docs_url, include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        root = str(request.scope.get("root_path", ""))
        if assets is None:
            body = (
                f"<!doctype html><title>{html.escape(app.title)}</title>"
                f"<p>Swagger UI is not installed here ({html.escape(INSTALL_HINT)}).</p>"
                f'<p>The OpenAPI document is at <a href="{root}{openapi_url}">{openapi_url}</a>.</p>'
            )
            return HTMLResponse(body)
        return get_swagger_ui_html(
            openapi_url=f"{root}{openapi_url}",
            title=f"{app.title} - Swagger UI",
            swagger_js_url=f"{root}{ASSETS_URL}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{ASSETS_URL}/swagger-ui.css",
            swagger_favicon_url=f"{root}{ASSETS_URL}/favicon-32x32.png",
        )

    return assets is not None
