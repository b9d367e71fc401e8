"""Host-side tuning in minichain.backend: malloc thresholds, BLAS threads."""
import os
import platform
import subprocess
import sys

import numpy
import pytest

from minichain import backend

glibc_only = pytest.mark.skipif(
    not sys.platform.startswith('linux') or platform.libc_ver()[0] != 'glibc',
    reason='mallopt is a glibc function')


@glibc_only
def test_tune_malloc_accepts_and_clamps():
    assert backend.tune_malloc() is True
    # above glibc's 32 MiB mmap limit: clamped, still accepted
    assert backend.tune_malloc(mmap_threshold=1 << 40) is True
    assert backend._malloc_tuned


@glibc_only
@pytest.mark.parametrize('env,expected', [('0', 'False'), ('1', 'True')])
def test_import_tunes_malloc_unless_opted_out(env, expected):
    code = 'from minichain import backend; print(backend._malloc_tuned)'
    out = subprocess.run([sys.executable, '-c', code], capture_output=True,
                         text=True, env=dict(os.environ, MINICHAIN_MALLOPT=env),
                         check=True)
    assert out.stdout.strip() == expected


def test_set_blas_threads_round_trip():
    before = backend.get_blas_threads()
    if before is None:
        pytest.skip('no OpenBLAS/MKL found in this process')
    try:
        assert backend.set_blas_threads(1) is True
        assert backend.get_blas_threads() == 1
        a = numpy.arange(64 * 64, dtype=numpy.float32).reshape(64, 64) / 4096
        numpy.testing.assert_allclose(a @ a, a.astype(numpy.float64) @ a,
                                      rtol=1e-5)
    finally:
        backend.set_blas_threads(before)
    assert backend.get_blas_threads() == before


@pytest.mark.parametrize('n', [0, -1, 1.5, True, None])
def test_set_blas_threads_rejects_bad_counts(n):
    with pytest.raises(ValueError, match='set_blas_threads'):
        backend.set_blas_threads(n)


def test_host_threads_default_and_setter(monkeypatch):
    monkeypatch.setattr(backend, '_host_threads', None)
    monkeypatch.delenv('MINICHAIN_HOST_THREADS', raising=False)
    assert backend.host_threads() == 1  # outside an op
    with backend.cpu_kernel_scope() as n:
        assert backend.host_threads() == n  # the op's threads
    monkeypatch.setattr(backend, '_host_threads', None)
    monkeypatch.setenv('MINICHAIN_HOST_THREADS', '3')
    assert backend.host_threads() == 3
    backend.set_host_threads(2)
    assert backend.host_threads() == 2
    with pytest.raises(ValueError, match='set_host_threads'):
        backend.set_host_threads(0)


def _blas_or_skip():
    before = backend.get_blas_threads()
    if before is None:
        pytest.skip('no OpenBLAS/MKL found in this process')
    return before


def test_cpu_kernel_scope_runs_blas_on_one_thread_and_restores():
    before = _blas_or_skip()
    try:
        backend.set_blas_threads(3)
        assert backend.cpu_kernel_threads() == 1  # outside any op
        with backend.cpu_kernel_scope() as n:
            assert n == 3 and backend.cpu_kernel_threads() == 3
            assert backend.get_blas_threads() == 1
            with backend.cpu_kernel_scope() as inner:  # a nested op
                assert inner == 3
            assert backend.get_blas_threads() == 1
        assert backend.get_blas_threads() == 3
        with pytest.raises(ZeroDivisionError):
            with backend.cpu_kernel_scope():
                1 / 0
        assert backend.get_blas_threads() == 3
        assert backend.cpu_kernel_threads() == 1
    finally:
        backend.set_blas_threads(before)


def test_ops_run_inside_the_scope():
    """FunctionNode.apply runs a NumPy forward inside cpu_kernel_scope."""
    from minichain.function_node import FunctionNode
    before = _blas_or_skip()
    seen = []

    class Probe(FunctionNode):
        def forward(self, inputs):
            seen.append((backend.get_blas_threads(),
                         backend.cpu_kernel_threads()))
            return inputs[0] * 2,
    try:
        backend.set_blas_threads(2)
        y, = Probe().apply((numpy.ones(3),))
        assert seen == [(1, 2)]
        assert backend.get_blas_threads() == 2
        numpy.testing.assert_array_equal(y.array, 2 * numpy.ones(3))
    finally:
        backend.set_blas_threads(before)
