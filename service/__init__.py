"""The HTTP layer: Litestar app, routes, auth, lifespan."""

from .app import AppSettings, create_app

__all__ = ["AppSettings", "create_app"]
