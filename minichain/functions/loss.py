"""Losses: softmax_cross_entropy, mean_squared_error."""

__all__ = []
