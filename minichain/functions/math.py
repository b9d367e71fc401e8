"""Elementwise math: exp, log, sqrt, square, absolute, maximum, minimum, clip."""

__all__ = []
