"""The CUDA kernels' source text, checked on any machine (the kernels
themselves run in tests/functions/test_cuda_kernels.py on a GPU, compile in
tests/cuda under ``make cuda-check`` and run emulated on the CPU in
test_pooling.py and test_convolution.py)."""
import types

from minichain.kernels.cuda import _elementwise as K


def test_window_sums_accumulate_in_float_for_float16():
    """col2im and the pooling windows summed in T, float16 included: a
    float16 sum stops growing by 1 past 2048 and is inf past 65504. They
    accumulate in ACC_T (float for float16), which CuPy compiles from the
    preamble (make cuda-check compiles every kernel in float16)."""
    sums = sorted(n for n, (_, _, op) in K.SPECS.items() if 'val +=' in op)
    assert sums == ['avg_bwd', 'avg_fwd', 'col2im', 'max_bwd']
    for name in sums:
        op = K.SPECS[name][2]
        assert 'ACC_T val = 0;' in op, name
        assert 'T val' not in op.replace('ACC_T val', ''), name
    assert 'struct minichain_acc<float16> { typedef float type; }' in \
        K._PREAMBLE
    kernel = K.make_kernel(types.SimpleNamespace(
        ElementwiseKernel=lambda *a, **k: k), 'col2im')
    assert kernel['preamble'] == K._PREAMBLE
