"""minichain.dist pieces that run without launching MPI."""
import subprocess
import sys

import numpy
import pytest

from minichain.dist import datasets
from minichain.dist.guards import safety
from minichain.dist.pure_nccl import from_bfloat16_bits, to_bfloat16_bits


def _python(code):
    return subprocess.run([sys.executable, '-c', code], capture_output=True,
                          text=True, timeout=60)


def test_missing_mpi4py_is_an_import_error_saying_how_to_install():
    res = _python('import sys; sys.modules["mpi4py"] = None\n'
                  'from minichain import dist\n'
                  'try:\n    dist.create_communicator("flat")\n'
                  'except ImportError as e:\n    print("IMPORTERROR", e)')
    assert 'IMPORTERROR' in res.stdout, res.stderr
    assert 'pip install mpi4py mpich' in res.stdout
    assert 'pip install -e ".[mpi]"' in res.stdout


def test_unknown_communicator_lists_the_valid_names():
    from minichain import dist
    with pytest.raises(ValueError) as e:
        dist.create_communicator('fast')
    for name in ('auto', 'naive', 'flat', 'ring', 'pure_nccl',
                 'hierarchical'):
        assert name in str(e.value)


def test_unknown_attribute():
    from minichain import dist
    with pytest.raises(AttributeError):
        dist.no_such_thing


def test_abort_switch(monkeypatch):
    monkeypatch.setitem(safety._state, 'enabled', None)
    monkeypatch.delenv(safety.ENV_NO_ABORT, raising=False)
    assert safety.abort_on_exception_enabled()
    monkeypatch.setenv(safety.ENV_NO_ABORT, '1')
    assert not safety.abort_on_exception_enabled()
    safety.set_abort_on_exception(True)
    assert safety.abort_on_exception_enabled()
    safety.set_abort_on_exception(False)
    assert not safety.abort_on_exception_enabled()


def test_disabled_hook_defers_to_the_previous_one(monkeypatch):
    seen = []
    monkeypatch.setitem(safety._state, 'enabled', False)
    monkeypatch.setitem(safety._state, 'previous',
                        lambda *exc: seen.append(exc[0]))
    safety._abort_hook(KeyError, KeyError('x'), None)
    assert seen == [KeyError]


def test_mismatch_message_groups_ranks_and_lists_differences():
    same = [('/a', (2, 3), 'float32'), ('/b', (3,), 'float32')]
    odd = [('/a', (2, 4), 'float32'), ('/c', None, None)]
    msg = safety.mismatch_message('where', [same, odd, same, same])
    assert msg.startswith('where: the model differs between ranks')
    assert 'ranks 0, 2-3' in msg and 'rank 1' in msg
    lines = msg.splitlines()
    row_a = next(line for line in lines if line.strip().startswith('/a'))
    assert '(2, 3) float32' in row_a and '(2, 4) float32' in row_a
    row_c = next(line for line in lines if line.strip().startswith('/c'))
    assert '-' in row_c.split() and 'uninitialized' in row_c
    assert safety.layout_hash(same) == safety.layout_hash(list(same))
    assert safety.layout_hash(same) != safety.layout_hash(odd)


@pytest.mark.parametrize('n,size', [(10, 3), (3, 4), (8, 4), (1, 1)])
def test_shard_bounds(n, size):
    equal = datasets.shard_bounds(n, size, True)
    assert {b - a for a, b in equal} == {-(-n // size)}
    exact = datasets.shard_bounds(n, size, False)
    assert exact[0][0] == 0 and exact[-1][1] == n
    assert all(a[1] == b[0] for a, b in zip(exact, exact[1:]))
    lens = [b - a for a, b in exact]
    assert max(lens) - min(lens) <= 1


def test_bfloat16_round_trip_rounds_to_nearest_even():
    x = numpy.array([1.0, -2.5, 3.14159265, 1e30, 0.0, 1 + 2 ** -8,
                     1 + 3 * 2 ** -8], dtype=numpy.float32)
    y = from_bfloat16_bits(to_bfloat16_bits(x))
    assert y.dtype == numpy.float32
    assert numpy.allclose(y, x, rtol=2 ** -8)
    assert y[0] == 1.0 and y[1] == -2.5 and y[4] == 0.0
    assert y[5] == 1.0 and y[6] == 1 + 2 ** -6  # ties go to even
