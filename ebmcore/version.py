"""The version of the ebmcore distribution."""

__version__ = "0.1.0"
