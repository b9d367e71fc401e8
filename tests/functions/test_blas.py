"""minichain.kernels.numpy._blas: the direct BLAS calls and the momentum update
that uses them."""
import os
import subprocess
import sys

import numpy
import pytest

from minichain import host
from minichain.kernels.numpy import _blas, _cpu_kernels

RNG = numpy.random.default_rng(0)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def _needs_blas():
    if not _blas.available():
        found = [(lib.internal_api, lib.filepath)
                 for lib in host._blas_libraries()]
        pytest.skip('no OpenBLAS with CBLAS axpby in this process '
                    '(BLAS libraries found: {})'.format(found))


def test_numpys_wheel_is_found():
    """NumPy from PyPI bundles OpenBLAS (scipy-openblas): the routines must
    be found there, or the update silently stays on the slow path."""
    apis = {lib.internal_api for lib in host._blas_libraries()}
    if apis != {'openblas'}:
        pytest.skip('NumPy is not linked to OpenBLAS here: {}'.format(apis))
    assert _blas.available()


@pytest.mark.parametrize('dtype,tol', [(numpy.float32, 1e-6),
                                       (numpy.float64, 1e-15)])
def test_axpby_and_axpy_compute_what_numpy_does(dtype, tol):
    _needs_blas()
    x, y = (RNG.standard_normal(1001).astype(dtype) for _ in range(2))
    want = 0.3 * x - 1.7 * y
    assert _blas.axpby(0.3, x, -1.7, y)
    numpy.testing.assert_allclose(y, want, rtol=tol, atol=tol)
    assert _blas.axpy(-2.0, x, y)
    numpy.testing.assert_allclose(y, want - 2 * x, rtol=tol, atol=tol)
    z = numpy.zeros(0, dtype)
    assert _blas.axpby(1.0, z, 1.0, z.copy())  # empty: nothing to do


@pytest.mark.parametrize('case', [
    'float16', 'mixed dtypes', 'lengths', 'strided', '2-D', 'read-only y',
    'not an array'])
def test_what_blas_cannot_take_is_refused_untouched(case):
    x = RNG.standard_normal(8).astype(numpy.float32)
    y = RNG.standard_normal(8).astype(numpy.float32)
    if case == 'float16':
        x, y = x.astype(numpy.float16), y.astype(numpy.float16)
    elif case == 'mixed dtypes':
        x = x.astype(numpy.float64)
    elif case == 'lengths':
        x = x[:7]
    elif case == 'strided':
        x, y = RNG.standard_normal(16).astype(numpy.float32)[::2], y
    elif case == '2-D':
        x, y = x.reshape(2, 4), y.reshape(2, 4)
    elif case == 'read-only y':
        y.flags.writeable = False
    else:
        x = list(x)
    before = y.copy()
    assert not _blas.axpby(1.0, x, 2.0, y)
    assert not _blas.axpy(1.0, x, y)
    assert numpy.array_equal(y, before)


def test_momentum_update_is_the_same_on_one_and_two_threads():
    """The update's blocks depend on the thread count; their values must
    not (each element is computed alone, whatever block it falls in)."""
    shape = (1 << 19) + 3  # large enough to be split, an uneven split
    p0, v0, g = (RNG.standard_normal(shape).astype(numpy.float32)
                 for _ in range(3))
    results = []
    before = host.get_blas_threads()
    try:
        for threads in (1, 2):
            if before is not None:
                host.set_blas_threads(threads)
            p, v = p0.copy(), v0.copy()
            _cpu_kernels.momentum_sgd(p, v, g, numpy.empty_like(g), 0.1, 0.9)
            results.append((p, v))
    finally:
        if before is not None:
            host.set_blas_threads(before)
    want_v = numpy.float32(0.9) * v0 - numpy.float32(0.1) * g
    for p, v in results:
        numpy.testing.assert_allclose(v, want_v, rtol=1e-6, atol=1e-7)
        numpy.testing.assert_allclose(p, p0 + want_v, rtol=1e-6, atol=1e-6)
    assert all(numpy.array_equal(a, b)
               for a, b in zip(results[0], results[1]))


def test_switched_off_from_the_environment():
    """MINICHAIN_DIRECT_BLAS=0: no direct calls, and the update is NumPy's
    passes, bit for bit."""
    code = (
        'import numpy\n'
        'from minichain.kernels.numpy import _blas, _cpu_kernels\n'
        'assert not _blas.available()\n'
        'r = numpy.random.default_rng(1)\n'
        'p, v, g = (r.standard_normal(1000).astype(numpy.float32)'
        ' for _ in range(3))\n'
        'want_v = numpy.float32(0.9) * v - numpy.float32(0.1) * g\n'
        'want_p = p + want_v\n'
        '_cpu_kernels.momentum_sgd(p, v, g, numpy.empty_like(g), 0.1, 0.9)\n'
        'assert numpy.array_equal(v, want_v)\n'
        'assert numpy.array_equal(p, want_p)\n'
        'print("ok")\n')
    env = dict(os.environ, MINICHAIN_DIRECT_BLAS='0')
    env['PYTHONPATH'] = os.pathsep.join(
        [ROOT] + [p for p in env.get('PYTHONPATH', '').split(os.pathsep)
                  if p])
    proc = subprocess.run([sys.executable, '-c', code], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == 'ok'
