"""The package version, in a module of its own: the bundle builder records it and imports nothing above."""

__version__ = "0.1.0"
