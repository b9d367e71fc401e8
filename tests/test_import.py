"""The package imports and works on a machine without CuPy and without MPI."""
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
