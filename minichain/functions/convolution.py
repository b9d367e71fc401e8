"""Convolution: convolution_2d, deconvolution_2d, im2col."""

__all__ = []
