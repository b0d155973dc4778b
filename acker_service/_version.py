"""The package version, read by the server, the CLI and Describe."""

__version__ = "0.1.0"
