"""Spark integration for the acker service."""
