"""The NumPy/CuPy switch, with and without a (fake) CuPy."""
import types

import numpy
import pytest

from minichain import Variable, backend


def test_get_array_module_on_the_host():
    a = numpy.ones(2)
    assert backend.get_array_module(a) is numpy
    assert backend.get_array_module(Variable(a), 1.0, None) is numpy
    assert backend.get_array_module() is numpy


def test_is_array():
    assert backend.is_array(numpy.ones(1))
    assert not backend.is_array([1.0])
    assert not backend.is_array(numpy.float32(1))


def test_to_cpu():
    a = numpy.ones(3)
    assert backend.to_cpu(a) is a  # no copy on the host
    assert backend.to_cpu(None) is None
    out = backend.to_cpu((a, [2.0]))  # containers converted element-wise
    assert isinstance(out, tuple) and out[0] is a
    assert isinstance(out[1], list) and isinstance(out[1][0], numpy.ndarray)
    assert backend.get_device_id(a) == -1


def test_gpu_available_is_a_bool():
    assert backend.gpu_available() in (True, False)


class FakeCudaError(RuntimeError):
    """As CuPy's CUDARuntimeError: the message and the status code."""

    def __init__(self, status, text):
        super().__init__(text)
        self.status = status


def _fake_cupy(device_count, driver=13000, runtime=13000):
    runtime_api = types.SimpleNamespace(
        getDeviceCount=device_count, driverGetVersion=lambda: driver,
        runtimeGetVersion=lambda: runtime)

    def is_available():  # CuPy's: any error is a cached False
        try:
            return device_count() > 0
        except Exception:
            return False
    cuda = types.SimpleNamespace(is_available=is_available,
                                 runtime=runtime_api)
    return types.SimpleNamespace(cuda=cuda, ndarray=type('FakeArray', (), {}))


def test_without_cupy_gpu_calls_say_why(monkeypatch):
    monkeypatch.setattr(backend, 'cupy', None)
    monkeypatch.setattr(backend, '_cupy_import_error',
                        ImportError("No module named 'cupy'"))
    assert backend.gpu_available() is False
    for call in (lambda: backend.to_gpu(numpy.ones(2)),
                 lambda: backend.get_cupy(),
                 lambda: backend.cuda_device(0)):
        with pytest.raises(RuntimeError, match='CuPy is not installed'):
            call()
    assert backend.get_array_module(numpy.ones(2)) is numpy


def test_cupy_without_a_device(monkeypatch):
    monkeypatch.setattr(backend, 'cupy', _fake_cupy(lambda: 0))
    assert backend.gpu_available() is False
    assert backend.gpu_problem()[0] is True
    with pytest.raises(RuntimeError, match='no CUDA device'):
        backend.to_gpu(numpy.ones(2))


def _raising(status, text):
    def count():
        raise FakeCudaError(status, text)
    return count


NO_DEVICE = 'cudaErrorNoDevice: no CUDA-capable device is detected'
OLD_DRIVER = ('cudaErrorInsufficientDriver: CUDA driver version is '
              'insufficient for CUDA runtime version')


@pytest.mark.parametrize('status,text,driver,absent', [
    (100, NO_DEVICE, 12040, True),
    (35, OLD_DRIVER, 0, True),            # no driver at all: no GPU here
    (35, OLD_DRIVER, 12040, False),       # a driver older than the runtime
    (999, 'cudaErrorUnknown: unknown error', 13000, False),
])
def test_cupy_whose_device_count_raises(monkeypatch, status, text, driver,
                                        absent):
    """A CUDA error is not reported as "no GPU": CuPy's is_available()
    turns every error into False, so an old driver (the cuda13 extra on a
    CUDA 12 driver) was blamed on CUDA_VISIBLE_DEVICES."""
    monkeypatch.setattr(backend, 'cupy', _fake_cupy(_raising(status, text),
                                                    driver=driver))
    assert backend.gpu_available() is False
    assert backend.gpu_problem()[0] is absent
    with pytest.raises(RuntimeError) as e:
        backend.check_cuda_available()
    message = str(e.value)
    if absent:
        assert 'no GPU can be used' in message, message
    else:
        assert text in message and 'no GPU' not in message, message
        assert 'CUDA_VISIBLE_DEVICES' not in message, message
    if driver == 12040 and status == 35:
        assert 'driver supports CUDA 12.4 and CuPy runs CUDA 13.0' in message
        assert '".[cuda12]"' in message


def test_cupy_whose_driver_query_raises_without_a_status(monkeypatch):
    def broken():
        raise OSError('libcuda.so: cannot open shared object file')
    monkeypatch.setattr(backend, 'cupy', _fake_cupy(broken))
    assert backend.gpu_available() is False
    assert 'libcuda.so: cannot open' in backend.gpu_problem()[1]


@pytest.mark.gpu
@pytest.mark.skipif(not backend.gpu_available(), reason='no CUDA GPU')
def test_gpu_round_trip():
    import cupy
    a = numpy.arange(6.0).reshape(2, 3)
    g = backend.to_gpu(a)
    assert isinstance(g, cupy.ndarray)
    assert backend.is_array(g)
    assert backend.get_array_module(g) is cupy
    assert backend.get_array_module(Variable(g)) is cupy
    assert backend.to_gpu(g) is g  # already there: no copy
    assert backend.get_device_id(g) == g.device.id
    numpy.testing.assert_array_equal(backend.to_cpu(g), a)
    g0 = backend.to_gpu(a, 0)
    assert g0.device.id == 0
    with backend.cuda_device(0):
        pair = backend.to_gpu([a, a])
    assert all(isinstance(x, cupy.ndarray) for x in pair)


def test_nccl_message_names_the_wheel():
    from minichain import _cuda_wheels as W
    assert 'pip install nvidia-nccl-cu13' in W.nccl_missing(None, None, 13)
    assert 'pip install nvidia-nccl-cu12' in W.nccl_missing(
        None, ImportError('x'), 12)
    assert 'nvidia-nccl-cu12 or nvidia-nccl-cu13' in W.nccl_missing(
        None, None, 99)


def _cupy_libs(monkeypatch, cublas):
    """CuPy's ``cupy_backends.cuda.libs`` with ``cublas`` as its cuBLAS
    module, or raising ``cublas`` (an ImportError) as CuPy's lazy loader
    does when libcublas or libcublasLt is missing."""
    libs = types.ModuleType('cupy_backends.cuda.libs')

    def load(name):
        if name != 'cublas':
            raise AttributeError(name)
        if isinstance(cublas, Exception):
            raise cublas
        return cublas
    libs.__getattr__ = load
    modules = __import__('sys').modules
    for name in ('cupy_backends', 'cupy_backends.cuda'):
        monkeypatch.setitem(modules, name, types.ModuleType(name))
    monkeypatch.setitem(modules, 'cupy_backends.cuda.libs', libs)


# The first line of CuPy 14.2's error without libcublasLt (cuda.pathfinder
# lists the folders it read on the lines after it).
NO_CUBLASLT = ('Failure finding "libcublasLt.so.13 or libcublasLt.so.12": '
               'No such file: libcublasLt.so.13 or libcublasLt.so.12')


def test_a_device_without_cublas_is_no_usable_gpu_and_says_why(monkeypatch):
    """CuPy loads cuBLAS at the first matrix product: without libcublasLt
    gpu_available() was True and the first matmul raised a pathfinder
    report from deep inside CuPy."""
    from minichain import _cuda_wheels
    monkeypatch.setattr(backend, 'cupy', _cupy_14_with(None))
    monkeypatch.setattr(_cuda_wheels, 'cuda_major', lambda cupy: 13)
    _cupy_libs(monkeypatch, ImportError(NO_CUBLASLT + '\n  listdir("/x"):'))
    assert backend.gpu_available() is False
    absent, why = backend.gpu_problem()
    assert absent is False  # a GPU machine that needs fixing, not "no GPU"
    assert '\n' not in why and NO_CUBLASLT in why, why
    assert 'pip install nvidia-cublas ' in why and '".[cuda13]"' in why
    with pytest.raises(RuntimeError, match='CuPy cannot load cuBLAS'):
        backend.check_cuda_available()
    _cupy_libs(monkeypatch, types.SimpleNamespace())
    monkeypatch.setattr(backend, 'cupy', _cupy_14_with(None))  # asked again
    assert backend.gpu_available() is True


def _cupy_14_with(nvrtc_error):
    def get_version():
        if nvrtc_error:
            raise OSError(nvrtc_error)
        return (13, 0)
    cuda = types.SimpleNamespace(is_available=lambda: True,
                                 runtime=types.SimpleNamespace(
                                     getDeviceCount=lambda: 1),
                                 nvrtc=types.SimpleNamespace(
                                     getVersion=get_version))
    return types.SimpleNamespace(cuda=cuda, ndarray=type('A', (), {}),
                                 __version__='14.2.0')


@pytest.mark.parametrize('nvrtc_error,headers,says', [
    ('libnvrtc.so.13: cannot open', '/inc', ['NVRTC', 'nvidia-cuda-nvrtc']),
    (None, None, ['the CUDA headers', 'pip install nvidia-cuda-runtime']),
    ('libnvrtc.so.13: cannot open', None, ['NVRTC', 'CUDA headers']),
])
def test_cupy_14_without_its_toolkit_wheels_says_which(
        monkeypatch, nvrtc_error, headers, says):
    """CuPy 14's wheel has no NVRTC and no CUDA headers: the first kernel
    failed with "Failed to find CUDA headers"; now the GPU check names the
    missing wheel."""
    from minichain import _cuda_wheels
    monkeypatch.setattr(backend, 'cupy', _cupy_14_with(nvrtc_error))
    _cupy_libs(monkeypatch, types.SimpleNamespace())
    monkeypatch.setattr(backend, '_toolkit_checked', None)
    monkeypatch.setattr(_cuda_wheels, 'cuda_headers',
                        lambda cupy=None: headers)
    monkeypatch.setattr(_cuda_wheels, 'cuda_major', lambda cupy: 13)
    with pytest.raises(RuntimeError) as e:
        backend.check_cuda_available()
    for text in says + ['".[cuda13]"', 'cannot compile kernels']:
        assert text in str(e.value)


def test_cupy_14_with_its_toolkit_wheels_passes(monkeypatch):
    from minichain import _cuda_wheels
    monkeypatch.setattr(backend, 'cupy', _cupy_14_with(None))
    _cupy_libs(monkeypatch, types.SimpleNamespace())
    monkeypatch.setattr(backend, '_toolkit_checked', None)
    monkeypatch.setattr(_cuda_wheels, 'cuda_headers',
                        lambda cupy=None: '/inc')
    backend.check_cuda_available()


def _toolkit(root):
    include = root / 'include'
    include.mkdir(parents=True)
    (include / 'cuda_runtime.h').write_text('/* */\n')
    return str(include)


@pytest.mark.parametrize('where', ['cupy root', 'CUDA_PATH', 'CUDA_HOME',
                                   'system', None])
def test_cuda_headers_are_found_where_cupy_finds_them(
        monkeypatch, tmp_path, where):
    """CuPy compiles against its CUDA root (from NVRTC's location),
    CUDA_PATH and /usr/local/cuda, not only the runtime wheel's headers: a
    node with a system CUDA and no runtime wheel was refused."""
    import sys
    from minichain import _cuda_wheels
    monkeypatch.setitem(sys.modules, 'cuda.pathfinder', types.SimpleNamespace(
        find_nvidia_header_directory=lambda name: None))
    for name in ('CUDA_PATH', 'CUDA_HOME'):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(_cuda_wheels, 'SYSTEM_CUDA', str(tmp_path / 'none'))
    root = tmp_path / 'cuda'
    include = _toolkit(root) if where else None
    cuda_path = str(root) if where == 'cupy root' else None
    cupy = types.SimpleNamespace(cuda=types.SimpleNamespace(
        get_cuda_path=lambda: cuda_path))
    if where in ('CUDA_PATH', 'CUDA_HOME'):
        monkeypatch.setenv(where, str(root))
    if where == 'system':
        monkeypatch.setattr(_cuda_wheels, 'SYSTEM_CUDA', str(root))
    assert _cuda_wheels.cuda_headers(cupy) == include


def test_cuda_headers_of_the_runtime_wheel_come_first(monkeypatch, tmp_path):
    import sys
    from minichain import _cuda_wheels
    wheel = _toolkit(tmp_path / 'wheel')
    monkeypatch.setitem(sys.modules, 'cuda.pathfinder', types.SimpleNamespace(
        find_nvidia_header_directory=lambda name: wheel))
    monkeypatch.setenv('CUDA_PATH', str(tmp_path / 'system'))
    _toolkit(tmp_path / 'system')
    assert _cuda_wheels.cuda_headers(None) == wheel


# The names of CuPy's cuBLAS module the fake below has: only real ones
# (tests/cuda/test_cupy_api.py checks them against the installed CuPy).
FAKE_CUBLAS_NAMES = ('CUBLAS_DEFAULT_MATH', 'setMathMode')


def test_tf32_switch_sets_cupys_float32_compute_type(monkeypatch):
    calls = []
    core = types.SimpleNamespace(
        COMPUTE_TYPE_DEFAULT=1, COMPUTE_TYPE_TF32=7,
        set_compute_type=lambda dtype, kind: calls.append((dtype, kind)),
        get_compute_type=lambda dtype: calls[-1][1] if calls else 1)
    modes = []
    cublas = types.SimpleNamespace(**dict(zip(FAKE_CUBLAS_NAMES, (
        0, lambda handle, mode: modes.append((handle, mode))))))
    fake = _cupy_14_with(None)
    fake._core = types.SimpleNamespace(
        _routines_linalg=core, set_compute_type=core.set_compute_type,
        get_compute_type=core.get_compute_type)
    fake.cuda.device = types.SimpleNamespace(get_cublas_handle=lambda: 42)
    monkeypatch.setattr(backend, 'cupy', fake)
    monkeypatch.setattr(backend, '_toolkit_checked', '')
    monkeypatch.setitem(__import__('sys').modules, 'cupy', fake)
    _cupy_libs(monkeypatch, cublas)
    assert backend.tf32_enabled() is False  # CuPy's default: full float32
    backend.set_tf32(True)
    assert calls == [(numpy.float32, 7)] and backend.tf32_enabled()
    assert modes == [(42, 3)]  # the batched products' math mode too
    backend.set_tf32(False)
    assert calls[-1] == (numpy.float32, 1) and not backend.tf32_enabled()
    assert modes[-1] == (42, 0)
