"""Chainer's ``chainer.training.util`` path: ``get_trigger``."""
from minichain.training.triggers import get_trigger  # noqa: F401

__all__ = ['get_trigger']
