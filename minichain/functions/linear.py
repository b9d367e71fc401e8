"""The fully connected layer's function: linear."""

__all__ = []
