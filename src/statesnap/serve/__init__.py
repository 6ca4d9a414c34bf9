"""An HTTP API in front of a :class:`~statesnap.python.follower.Follower` (``statesnap serve``).

``create_app(follower)`` builds the FastAPI app; ``HttpServer`` runs it with uvicorn.

Layout: ``app`` (the routes and the API's contract), ``consistency`` (what an answer reads: the
live replica as fresh as asked, or one generation), ``rows`` (keys and values over HTTP, a scan
page), ``headers`` (the ``X-Statesnap-*`` headers), ``models`` (the OpenAPI shapes), ``problems``
(error answers), ``params``, ``waits``, ``generations``, ``metrics``, ``docs``, ``server``.
"""

from statesnap.serve.app import create_app
from statesnap.serve.headers import Freshness
from statesnap.serve.metrics import render_metrics
from statesnap.serve.server import HttpServer

__all__ = ["Freshness", "HttpServer", "create_app", "render_metrics"]
