"""An HTTP API in front of a :class:`~statesnap.python.follower.Follower` (``statesnap serve``).

``create_app(follower)`` builds the FastAPI app; ``HttpServer`` runs it with uvicorn.
"""

from statesnap.serve.app import Freshness, create_app
from statesnap.serve.metrics import render_metrics
from statesnap.serve.server import HttpServer

__all__ = ["Freshness", "HttpServer", "create_app", "render_metrics"]
