"""Metrics that are not differentiated: accuracy."""

__all__ = []
