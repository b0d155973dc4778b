"""Python client for the acker service."""
