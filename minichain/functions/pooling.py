"""Pooling: max_pooling_2d, average_pooling_2d, global_average_pooling_2d."""

__all__ = []
