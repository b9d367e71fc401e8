"""Activations: identity, relu, leaky_relu, sigmoid, tanh, softmax, log_softmax."""

__all__ = []
