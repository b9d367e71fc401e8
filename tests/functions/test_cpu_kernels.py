"""minichain.kernels.numpy._cpu_kernels: which ops take a CPU kernel, and that
every kernel runs with the BLAS on one thread and its own thread count."""
import threading

import numpy
import pytest

import minichain.functions as F
from minichain import Variable, host, using_config
from minichain.kernels.numpy import (_cpu_kernels, _im2col,
                                     _normalization_kernels,
                                     _parallel)

RNG = numpy.random.default_rng(0)


def _f32(*shape):
    return RNG.standard_normal(shape).astype(numpy.float32)


def _spy(monkeypatch, module, name, calls):
    real = getattr(module, name)

    def spy(*args, **kwargs):
        calls.append(name)
        return real(*args, **kwargs)
    monkeypatch.setattr(module, name, spy)


def _backward(y):
    y.grad = numpy.ones_like(y.array)
    y.backward()


# (what runs, the kernels it must call, their module)
FAST = [
    ('matmul', lambda: F.matmul(_f32(3, 4), _f32(4, 2)), ['matmul'],
     _cpu_kernels),
    ('linear', lambda: F.linear(_f32(3, 4), _f32(2, 4)), ['matmul'],
     _cpu_kernels),
    ('convolution', lambda: _backward(F.convolution_2d(
        Variable(_f32(2, 3, 5, 5)), Variable(_f32(4, 3, 3, 3)), pad=1)),
     ['conv_forward', 'deconv_forward', 'conv_grad_w'], _im2col),
    ('batch_normalization', lambda: _backward(F.batch_normalization(
        Variable(_f32(4, 3, 2, 2)), Variable(_f32(3)), Variable(_f32(3)))),
     ['cpu_forward', 'cpu_backward'], _normalization_kernels),
]


@pytest.mark.parametrize('case', FAST, ids=[c[0] for c in FAST])
def test_float32_on_the_cpu_takes_the_kernel(case, monkeypatch):
    _, run, kernels, module = case
    calls = []
    for name in kernels:
        _spy(monkeypatch, module, name, calls)
    with using_config('use_onednn', 'never'):  # the NumPy path's kernels
        run()
    assert set(calls) == set(kernels)


@pytest.mark.parametrize('op', [F.add, F.sub, F.mul, F.div])
def test_elementwise_arithmetic_has_no_kernel(op):
    # Add's kernel was retired (issue 27, item 5: 1.00x of a step)
    from minichain import kernels
    from minichain.functions import basic_math
    kind = {F.add: basic_math.Add, F.sub: basic_math.Sub,
            F.mul: basic_math.Mul, F.div: basic_math.Div}[op]
    assert kernels.registered(kind, 'numpy') is None
    a, b = _f32(3, 4), _f32(3, 4) + 3
    numpy.testing.assert_array_equal(op(a, b).array,
                                     {F.add: a + b, F.sub: a - b,
                                      F.mul: a * b, F.div: a / b}[op])


def test_kernels_match_plain_numpy():
    a, b = _f32(5, 3), _f32(5, 3)
    numpy.testing.assert_allclose(_cpu_kernels.matmul(a, b.T), a @ b.T,
                                  rtol=1e-6)


def test_a_training_step_splits_work_only_inside_kernel_scopes(monkeypatch):
    """Every share-out of work on the caller's thread (elementwise passes,
    products, image chunks) happens with the BLAS on one thread and the
    BLAS's own count as the kernel's thread count."""
    before = host.get_blas_threads()
    if before is None:
        pytest.skip('no BLAS found: the thread count is not settable')
    main = threading.current_thread()
    seen = []
    for name in ('elementwise', 'split_rows', 'matmul', 'over_chunks'):
        real = getattr(_parallel, name)

        def spy(*args, _real=real, _name=name, **kwargs):
            if threading.current_thread() is main:
                seen.append((_name, host.get_blas_threads(),
                             host.cpu_kernel_threads()))
            return _real(*args, **kwargs)
        monkeypatch.setattr(_parallel, name, spy)
    monkeypatch.setattr(host, '_host_threads', None)
    monkeypatch.delenv('MINICHAIN_HOST_THREADS', raising=False)
    try:
        host.set_blas_threads(2)
        x = Variable(_f32(2, 3, 6, 6))
        W = Variable(_f32(4, 3, 3, 3))
        # the NumPy path's kernels (oneDNN's would take the convolution and
        # the batch normalization)
        with using_config('use_onednn', 'never'):
            h = F.batch_normalization(F.convolution_2d(x, W, pad=1),
                                      Variable(_f32(4)), Variable(_f32(4)))
            h = F.relu(h) + h
            _backward(F.linear(h, Variable(_f32(2, 144))))
        assert {s[0] for s in seen} == {'elementwise', 'split_rows',
                                        'matmul', 'over_chunks'}
        assert {s[1:] for s in seen} == {(1, 2)}
        assert host.get_blas_threads() == 2
    finally:
        host.set_blas_threads(before)
