"""Normalization: batch_normalization, fixed_batch_normalization."""

__all__ = []
