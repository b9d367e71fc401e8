"""The ``im2col`` / ``col2im`` nodes on CuPy: the columns of the whole
batch built by one CUDA kernel (``_elementwise.py``), one thread per
element, instead of one CuPy call per kernel offset. The convolution
nodes themselves have the GPU-shaped kernels of ``convolution.py``.
"""
from minichain import kernels
from minichain.functions.convolution import Col2Im, Im2Col
from minichain.kernels.cuda import _elementwise


def im2col(node, inputs):
    x, = inputs
    if not kernels.on_cupy(inputs):
        return None
    col = _elementwise.im2col(x, node.g, batch_major=True)
    return col.reshape(x.shape[0], -1, node.g.oh, node.g.ow),


def col2im(node, inputs):
    col, = inputs
    if not kernels.on_cupy(inputs):
        return None
    g = node.g
    col = col.reshape(col.shape[0], -1, g.kh, g.kw, g.oh, g.ow)
    return _elementwise.col2im(col, g, batch_major=True),


kernels.register(Im2Col, 'cuda', im2col)
kernels.register(Col2Im, 'cuda', col2im)
