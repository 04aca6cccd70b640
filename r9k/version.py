"""The plugin's version: one place that the package and its provenance line both read."""

__version__ = "0.1.0"
