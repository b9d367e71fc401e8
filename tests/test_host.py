"""minichain.host: malloc thresholds, BLAS threads, the CPU kernels' threads."""
import os
import platform
import subprocess
import sys
import textwrap

import numpy
import pytest

from minichain import backend, host

glibc_only = pytest.mark.skipif(
    not sys.platform.startswith('linux') or platform.libc_ver()[0] != 'glibc',
    reason='mallopt is a glibc function')


@glibc_only
def test_tune_malloc_accepts_and_clamps(monkeypatch):
    monkeypatch.delenv('MINICHAIN_MALLOPT', raising=False)
    assert host.tune_malloc() is True
    # above glibc's 32 MiB mmap limit: clamped, still accepted
    assert host.tune_malloc(mmap_threshold=1 << 40) is True


# Every symbol looked up through ctypes is an audit event: the child prints
# whether mallopt was among them after `import minichain`, then after the
# explicit switch.
_MALLOPT_CALLS = textwrap.dedent('''
    import sys
    symbols = []
    sys.addaudithook(lambda event, args: symbols.append(args[1])
                     if event == 'ctypes.dlsym' else None)
    import minichain, minichain.functions, minichain.dist
    from minichain import host
    print('mallopt' in symbols)
    print(host.tune_malloc(), 'mallopt' in symbols)
''')


@glibc_only
@pytest.mark.parametrize('env,expected', [
    ('1', ['False', 'True True']), ('0', ['False', 'False False'])])
def test_malloc_is_tuned_only_when_a_program_asks(env, expected):
    out = subprocess.run([sys.executable, '-c', _MALLOPT_CALLS],
                         capture_output=True, text=True, check=True,
                         env=dict(os.environ, MINICHAIN_MALLOPT=env))
    assert out.stdout.split('\n')[:2] == expected


def test_backend_keeps_the_host_names():
    for name in host.__all__:
        if name != 'cpu_kernel':
            assert getattr(backend, name) is getattr(host, name), name


def _blas_or_skip():
    before = host.get_blas_threads()
    if before is None:
        pytest.skip('no BLAS found in this process')
    return before


def test_set_blas_threads_round_trip():
    before = _blas_or_skip()
    try:
        assert host.set_blas_threads(1) is True
        assert host.get_blas_threads() == 1
        a = numpy.arange(64 * 64, dtype=numpy.float32).reshape(64, 64) / 4096
        numpy.testing.assert_allclose(a @ a, a.astype(numpy.float64) @ a,
                                      rtol=1e-5)
    finally:
        host.set_blas_threads(before)
    assert host.get_blas_threads() == before


@pytest.mark.parametrize('n', [0, -1, 1.5, True, None])
def test_set_blas_threads_rejects_bad_counts(n):
    with pytest.raises(ValueError, match='set_blas_threads'):
        host.set_blas_threads(n)


def test_host_threads_default_and_setter(monkeypatch):
    monkeypatch.setattr(host, '_host_threads', None)
    monkeypatch.delenv('MINICHAIN_HOST_THREADS', raising=False)
    assert host.host_threads() == 1  # outside a kernel
    with host.cpu_kernel_scope() as n:
        assert host.host_threads() == n  # the kernel's threads
    monkeypatch.setattr(host, '_host_threads', None)
    monkeypatch.setenv('MINICHAIN_HOST_THREADS', '3')
    assert host.host_threads() == 3
    host.set_host_threads(2)
    assert host.host_threads() == 2
    with pytest.raises(ValueError, match='set_host_threads'):
        host.set_host_threads(0)


def test_cpu_kernel_scope_runs_blas_on_one_thread_and_restores():
    before = _blas_or_skip()
    try:
        host.set_blas_threads(3)
        assert host.cpu_kernel_threads() == 1  # outside any kernel
        with host.cpu_kernel_scope() as n:
            assert n == 3 and host.cpu_kernel_threads() == 3
            assert host.get_blas_threads() == 1
            with host.cpu_kernel_scope() as inner:  # a nested kernel
                assert inner == 3
            assert host.get_blas_threads() == 1
        assert host.get_blas_threads() == 3
        with pytest.raises(ZeroDivisionError):
            with host.cpu_kernel_scope():
                1 / 0
        assert host.get_blas_threads() == 3
        assert host.cpu_kernel_threads() == 1
    finally:
        host.set_blas_threads(before)


def test_cpu_kernel_scopes_numpy_calls_only():
    before = _blas_or_skip()
    seen = []

    @host.cpu_kernel
    def kernel(a):
        seen.append((host.get_blas_threads(), host.cpu_kernel_threads()))
        return a

    class Device:  # stands for a CuPy array
        pass
    try:
        host.set_blas_threads(2)
        a = numpy.ones(3)
        assert kernel(a) is a
        assert seen.pop() == (1, 2)
        kernel(Device())
        assert seen.pop() == (2, 1)
        assert host.get_blas_threads() == 2
    finally:
        host.set_blas_threads(before)


def test_the_engine_leaves_the_blas_alone():
    """FunctionNode.apply sets no thread policy: an op without a kernel
    runs with the BLAS as the program set it."""
    from minichain.function_node import FunctionNode
    before = _blas_or_skip()
    seen = []

    class Probe(FunctionNode):
        def forward(self, inputs):
            seen.append((host.get_blas_threads(), host.cpu_kernel_threads()))
            return inputs[0] * 2,
    try:
        host.set_blas_threads(2)
        y, = Probe().apply((numpy.ones(3),))
        assert seen == [(2, 1)]
        numpy.testing.assert_array_equal(y.array, 2 * numpy.ones(3))
    finally:
        host.set_blas_threads(before)
