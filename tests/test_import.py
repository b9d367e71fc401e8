"""The package imports and works on a machine without CuPy and without MPI."""
import os
import subprocess
import sys
import textwrap

import minichain

# Run in a fresh interpreter in which ``import cupy`` and ``import mpi4py``
# fail as they do when the packages are missing (a None entry in
# sys.modules makes the import raise ImportError).
CODE = textwrap.dedent('''
    import sys
    sys.modules['cupy'] = None
    sys.modules['mpi4py'] = None
    import numpy
    import minichain
    import minichain.functions as F
    import minichain.dist
    from minichain import backend
    assert backend.cupy is None
    assert backend.gpu_available() is False
    try:
        backend.to_gpu(numpy.ones(2))
    except RuntimeError as e:
        assert 'CuPy is not installed' in str(e), str(e)
    else:
        raise AssertionError('to_gpu did not raise')
    x = minichain.Variable(numpy.array([1.0, 2.0]))
    F.sum(F.tanh(x) * x).backward()
    assert x.grad.shape == (2,)
    assert sys.modules['cupy'] is None and sys.modules['mpi4py'] is None
    print('ok')
''')


def test_imports_without_cupy_and_mpi4py():
    result = subprocess.run([sys.executable, '-c', CODE], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == 'ok'


def test_public_names():
    for name in ('Variable', 'Parameter', 'FunctionNode', 'config',
                 'using_config', 'no_backprop_mode', 'force_backprop_mode',
                 'as_variable', 'backend', 'functions'):
        assert hasattr(minichain, name), name
    from minichain.gradient_check import (  # noqa: F401
        check_backward, check_double_backward, numerical_grad)


# Where CuPy is not installed, a `cupy` package that records any attempt to
# import it stands first on sys.path, so that "not imported" also means
# "not even tried" (a failed import leaves nothing in sys.modules).
_POISON = ('import os\n'
           'open(os.environ["CUPY_TRIED"], "w").close()\n'
           'raise ImportError("minichain tried to import cupy")\n')
_LAZY_CODE = textwrap.dedent('''
    import sys
    import numpy
    import minichain
    import minichain.functions as F
    from minichain import dist, links as L
    dist.create_multi_node_optimizer; dist.scatter_dataset
    dist.MultiNodeBatchNormalization
    import minichain.dist.testing
    x = minichain.Variable(numpy.ones((2, 3), numpy.float32))
    F.sum(F.relu(L.Linear(3, 2)(x))).backward()
    print('mpi4py' in sys.modules, 'cupy' in sys.modules)
''')


def test_import_does_not_load_mpi4py_or_cupy(tmp_path):
    import importlib.util
    env = dict(os.environ, CUPY_TRIED=str(tmp_path / 'tried'))
    if importlib.util.find_spec('cupy') is None:
        (tmp_path / 'cupy').mkdir()
        (tmp_path / 'cupy' / '__init__.py').write_text(_POISON)
        env['PYTHONPATH'] = os.pathsep.join(
            [str(tmp_path)] + [p for p in [os.environ.get('PYTHONPATH')] if p])
    result = subprocess.run([sys.executable, '-c', _LAZY_CODE], env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ['False', 'False']
    assert not (tmp_path / 'tried').exists(), 'import minichain tried cupy'
