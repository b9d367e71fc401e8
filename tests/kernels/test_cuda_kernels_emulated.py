"""Which CUDA kernels the seam runs for the convolution nodes.

The GPU-shaped convolutions (``minichain/kernels/cuda/convolution.py``)
are the ``'cuda'`` kernels of the three convolution nodes; their values
are compared with the bodies on NumPy in ``tests/kernels/cuda``. The
whole-batch columns of one CUDA kernel serve the ``im2col`` / ``col2im``
nodes, checked against the bodies under the CPU emulation of CuPy's
ElementwiseKernel in ``tests/functions/test_convolution.py``.
"""
from minichain import kernels
from minichain.functions.convolution import (Col2Im, Convolution2D,
                                             Convolution2DGradW,
                                             Deconvolution2D, Im2Col)


def test_the_convolution_nodes_run_the_gpu_shaped_kernels():
    from minichain.kernels.cuda import convolution, im2col
    # each under config.fp32_math's cuBLAS mode (tests/kernels/cuda)
    assert kernels.registered(Convolution2D, 'cuda').__wrapped__ is \
        convolution.convolution_2d
    assert kernels.registered(Deconvolution2D, 'cuda').__wrapped__ is \
        convolution.deconvolution_2d
    assert kernels.registered(Convolution2DGradW, 'cuda').__wrapped__ is \
        convolution.convolution_2d_grad_w
    assert kernels.registered(Im2Col, 'cuda') is im2col.im2col
    assert kernels.registered(Col2Im, 'cuda') is im2col.col2im
