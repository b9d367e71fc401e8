"""minichain.backend's GPU checks against the real CuPy (``make
cuda-check``: CuPy, NVRTC, the headers and NCCL, no GPU, no cuBLAS)."""
import pytest

cupy = pytest.importorskip(
    'cupy', reason='CuPy is not installed; `make cuda-check` runs this in '
    '.venv-cuda13')

from minichain import backend  # noqa: E402


def test_a_device_without_cublas_is_reported_in_one_line(monkeypatch):
    """The cuda-check venv has no cuBLAS wheel, as a device's Python may
    not: with a device seen, gpu_available() was True and the first matmul
    raised CuPy's many-line pathfinder report."""
    try:
        from cupy_backends.cuda.libs import cublas  # noqa: F401
        pytest.skip('cuBLAS is installed here')
    except ImportError:
        pass
    monkeypatch.setattr(cupy.cuda.runtime, 'getDeviceCount', lambda: 1)
    monkeypatch.setattr(backend, '_devices', (None, None))
    assert backend.gpu_available() is False
    absent, why = backend.gpu_problem()
    assert absent is False and '\n' not in why, why
    assert 'libcublas' in why and 'pip install nvidia-cublas' in why, why
    monkeypatch.undo()
    monkeypatch.setattr(backend, '_devices', (None, None))
    assert backend.gpu_problem()[0] is True  # no device here, really
