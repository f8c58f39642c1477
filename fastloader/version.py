"""fastloader's version, in a module of its own: the pack tools record it without importing the loader."""

__version__ = "0.1.0"
