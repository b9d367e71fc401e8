"""minichain.backends.cuda (also minichain.cuda): Chainer's chainer.cuda."""
import subprocess
import sys

import numpy
import pytest

import minichain
from minichain import backend
from minichain.backends import cuda

GPU = backend.gpu_available()


def test_module_paths():
    import minichain.cuda
    assert minichain.cuda is cuda is minichain.backends.cuda
    from minichain.cuda import get_device_from_id, to_cpu  # noqa: F401
    assert cuda.get_array_module(numpy.zeros(1)) is numpy
    assert cuda.get_array_module(minichain.Variable(numpy.zeros(1))) is numpy


def test_import_asks_no_gpu_question():
    """Importing it neither asks whether a GPU answers nor fetches CuPy
    (either may load CuPy); ``available`` and ``cupy`` ask when used."""
    code = ('import minichain.backend as b\n'
            'def boom(*a):\n    raise SystemExit("asked at import")\n'
            'b.gpu_available = b.get_cupy = boom\n'
            'import minichain\nfrom minichain import cuda\n'
            'print("imported")\ncuda.available\n')
    out = subprocess.run([sys.executable, '-c', code], capture_output=True,
                         text=True, timeout=120)
    assert out.stdout.strip() == 'imported', out.stderr
    assert out.returncode != 0 and 'asked at import' in out.stderr


def test_host_device_from_id_is_the_dummy_device():
    for device_id in (None, -1, -5):
        device = cuda.get_device_from_id(device_id)
        assert device is cuda.DummyDevice
    device.use()
    with device as entered:
        assert entered is device
    assert int(device) == -1 and device.id == -1
    assert device == cuda.DummyDevice and repr(device) == 'DummyDevice'


def test_to_cpu_and_placeholders_without_a_gpu():
    x = numpy.arange(3.0)
    assert cuda.to_cpu(x) is x
    assert cuda.to_cpu(None) is None
    a, b = cuda.to_cpu((x, None))
    assert a is x and b is None
    if GPU:
        pytest.skip('the placeholders are for machines without a GPU')
    assert cuda.available is False
    assert numpy is not cuda.cupy
    assert not isinstance(x, cuda.ndarray)
    with pytest.raises(RuntimeError, match='minichain: CuPy'):
        cuda.to_gpu(x)
    with pytest.raises(RuntimeError, match='minichain: CuPy'):
        cuda.get_device_from_id(0)
    with pytest.raises(RuntimeError, match='minichain: CuPy'):
        cuda.cupy.random
    with pytest.raises(RuntimeError, match='minichain: CuPy'):
        cuda.check_cuda_available()
    with pytest.raises(AttributeError, match='no attribute'):
        cuda.memory_pool


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason='no CUDA GPU')
def test_gpu_round_trip():
    cp = backend.get_cupy()
    assert cuda.available is True and cuda.cupy is cp
    assert cuda.ndarray is cp.ndarray
    x = numpy.arange(6.0).reshape(2, 3)
    for device in (None, 0, cuda.get_device_from_id(0),
                   minichain.get_device('@cupy:0'), cuda.DummyDevice):
        g = cuda.to_gpu(x, device)
        assert isinstance(g, cp.ndarray) and g.device.id == 0
        assert cuda.get_array_module(g) is cp
        numpy.testing.assert_array_equal(cuda.to_cpu(g), x)
    with cuda.get_device_from_id(0):
        assert cp.cuda.Device().id == 0
    cuda.get_device_from_id(0).use()
