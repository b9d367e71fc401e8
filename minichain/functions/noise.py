"""Stochastic functions: dropout."""

__all__ = []
