import numpy
import pytest

import minichain
from minichain import backend, device
from minichain import links as L

gpu = pytest.mark.skipif(not backend.gpu_available(), reason='no CUDA GPU')


@pytest.mark.parametrize('spec', [-1, '@numpy', 'cpu', 'numpy',
                                  numpy.int64(-1)])
def test_cpu_specs(spec):
    d = minichain.get_device(spec)
    assert isinstance(d, device.CpuDevice)
    assert d.xp is numpy
    assert d.device_id == -1
    assert repr(d) == '<CpuDevice @numpy>'
    d.use()  # a no-op on the host
    assert d == minichain.get_device('@numpy')


def test_device_passes_through():
    d = minichain.get_device('@numpy')
    assert minichain.get_device(d) is d


def test_cpu_send_copies_only_foreign_arrays():
    d = minichain.get_device(-1)
    x = numpy.arange(3)
    assert d.send(x) is x
    a, b = d.send((x, numpy.float32(2)))
    assert a is x and isinstance(b, numpy.ndarray) and b == 2


@pytest.mark.parametrize('spec', ['@cupy', 'gpu0', '@numpy:1', 'cuda:x',
                                  ''])
def test_bad_string_spec(spec):
    with pytest.raises(ValueError, match='get_device: unknown device spec'):
        minichain.get_device(spec)


@pytest.mark.parametrize('spec', [None, 1.0, True, numpy])
def test_bad_spec_type(spec):
    with pytest.raises(TypeError, match='get_device'):
        minichain.get_device(spec)


@pytest.mark.skipif(backend.gpu_available(), reason='a GPU is present')
@pytest.mark.parametrize('spec', [0, '@cupy:0', 'cuda:1'])
def test_gpu_without_cuda_raises_backend_error(spec):
    with pytest.raises(RuntimeError, match='CuPy|CUDA'):
        minichain.get_device(spec)


def test_link_to_device_cpu():
    link = L.Linear(3, 2)
    assert link.to_device('@numpy') is link
    assert link.xp is numpy and isinstance(link.W.array, numpy.ndarray)


@gpu
@pytest.mark.gpu
def test_gpu_device_and_link_to_device():
    cupy = backend.get_cupy()
    d = minichain.get_device('@cupy:0')
    assert d.xp is cupy and d.device_id == 0 and repr(d) == \
        '<GpuDevice @cupy:0>'
    assert d == minichain.get_device(0)
    d.use()
    x = d.send(numpy.arange(4.0))
    assert isinstance(x, cupy.ndarray)
    link = L.Linear(3, 2).to_device(0)
    assert isinstance(link.W.array, cupy.ndarray)
    link.to_device(-1)
    assert isinstance(link.W.array, numpy.ndarray)


@pytest.mark.parametrize('spec', ['-1', ' -1 ', '-2'])
def test_integer_strings_as_chainer_examples_pass_them(spec):
    assert minichain.get_device(spec).xp is numpy


@pytest.mark.parametrize('rank,size,visible,want', [
    (0, 4, 4, 0), (3, 4, 4, 3), (2, 4, 8, 2),
    (1, 2, 1, 0),  # the launcher set CUDA_VISIBLE_DEVICES per rank
    (3, 4, 1, 0),
    (3, 4, 2, 1),  # fewer GPUs than ranks: round robin (NCCL refuses)
])
def test_rank_device_id_picks_from_what_is_visible(rank, size, visible,
                                                   want):
    assert device.rank_device_id(rank, size, visible) == want


def test_rank_device_id_errors():
    with pytest.raises(RuntimeError, match='no GPU visible to local rank 1'):
        device.rank_device_id(1, 2, 0)
    with pytest.raises(RuntimeError, match=r'local rank 2 is not in \[0, 2\)'):
        device.rank_device_id(2, 2, 4)


@gpu
@pytest.mark.gpu
def test_get_rank_device_on_a_gpu(capsys):
    d = device.get_rank_device(0, 1)
    assert d.device_id == 0
    assert backend.get_cupy().cuda.Device().id == 0
    assert 'local rank 0 of 1 uses GPU 0' in capsys.readouterr().err
    n = device.visible_gpu_count()
    with pytest.raises(RuntimeError, match='sees {} GPU'.format(n)):
        minichain.get_device(n)
