"""The package version, in a module of its own so that any layer can name it without importing
the whole public API (``statesnap/__init__.py`` imports the engines)."""

__all__ = ["__version__"]

__version__ = "0.1.0"
