"""Pooling on CuPy: one CUDA thread per output (forward) or input
(backward) element (``_elementwise.py``)."""
from minichain import kernels
from minichain.functions.pooling import (AveragePooling2D,
                                         AveragePooling2DGrad, MaxPooling2D,
                                         MaxPooling2DGather, MaxPooling2DGrad)
from minichain.kernels.cuda import _elementwise


def max_pooling_2d(node, inputs):
    x, = inputs
    if not kernels.on_cupy(inputs):
        return None
    y, node.indexes = _elementwise.max_pool_forward(x, node.g)
    return y,


def max_pooling_2d_grad(node, inputs):
    gy, = inputs
    if not kernels.on_cupy(inputs):
        return None
    return _elementwise.max_pool_backward(gy, node.indexes, node.g),


def max_pooling_2d_gather(node, inputs):
    ggx, = inputs
    if not kernels.on_cupy(inputs):
        return None
    return _elementwise.max_pool_gather(ggx, node.indexes, node.g),


def average_pooling_2d(node, inputs):
    x, = inputs
    if not kernels.on_cupy(inputs):
        return None
    return _elementwise.avg_pool_forward(x, node.g),


def average_pooling_2d_grad(node, inputs):
    gy, = inputs
    if not kernels.on_cupy(inputs):
        return None
    return _elementwise.avg_pool_backward(gy, node.g),


kernels.register(MaxPooling2D, 'cuda', max_pooling_2d)
kernels.register(MaxPooling2DGrad, 'cuda', max_pooling_2d_grad)
kernels.register(MaxPooling2DGather, 'cuda', max_pooling_2d_gather)
kernels.register(AveragePooling2D, 'cuda', average_pooling_2d)
kernels.register(AveragePooling2DGrad, 'cuda', average_pooling_2d_grad)
