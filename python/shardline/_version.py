"""The package version (read by python/setup.py too)."""

__version__ = "0.1.0"
