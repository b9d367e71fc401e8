"""Every CuPy name minichain's code uses exists in the installed CuPy.

Run by ``make cuda-check`` (``.venv-cuda`` has CuPy and the NCCL wheel);
skipped where CuPy is not installed. The source of minichain, models/ and
bench/ is read with ``ast``: attribute chains on the names the code binds
to CuPy (``cupy``, ``cp``, ``xp`` from ``backend.get_array_module`` or
``get_cupy``, an object's ``.xp``, ``nccl``, ``runtime``), attributes of objects
CuPy returns (``cupy.cuda.Device(i).pci_bus_id``, a stream's ``ptr``, the
NCCL communicator's methods, with the number of arguments each call
passes) and the ``NCCL_*`` constants named in strings.
"""
import ast
import functools
import os
import re
import subprocess
import sys
import tempfile

import pytest

cupy = pytest.importorskip(
    'cupy', reason='CuPy is not installed; `make cuda-check` checks the '
    'CuPy names in .venv-cuda')

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
FOLDERS = ('minichain', 'models', 'bench')
_GETTERS = {'get_cupy': 'cupy', 'get_array_module': 'cupy',
            'get_nccl': 'nccl', 'nccl_module': 'nccl'}
_CONVENTIONS = {'cupy': 'cupy', 'cp': 'cupy', 'nccl': 'nccl',
                'cublas': 'cublas'}


def _nccl():
    from cupy.cuda import nccl
    if not getattr(nccl, 'available', True):
        pytest.fail('cupy.cuda.nccl is not available: install the NCCL '
                    'wheel (nvidia-nccl-cu12 / -cu13) in this environment')
    return nccl


@functools.lru_cache(maxsize=None)
def cublas_names():
    """The names of CuPy's cuBLAS module (``cupy_backends.cuda.libs.
    cublas``). Importing it loads libcublas, which the cuda-check venv
    lacks (a 440 MB wheel): then it is imported in a child process against
    an empty stand-in library of the same soname, bound lazily (no cuBLAS
    function is called at import), for the module's own ``dir()``."""
    try:
        from cupy_backends.cuda.libs import cublas
        return frozenset(dir(cublas))
    except ImportError:
        pass
    from minichain import _cuda_wheels
    soname = 'libcublas.so.{}'.format(_cuda_wheels.cuda_major(cupy))
    with tempfile.TemporaryDirectory() as tmp:
        stub = os.path.join(tmp, soname)
        with open(stub + '.c', 'w') as f:
            f.write('int minichain_stub;\n')
        try:
            subprocess.run(['cc', '-shared', '-fPIC', '-Wl,-soname,' + soname,
                            '-o', stub, stub + '.c'], check=True)
        except (OSError, subprocess.CalledProcessError) as e:
            pytest.skip('no libcublas and no C compiler for a stand-in: '
                        '{}'.format(e))
        out = subprocess.run([sys.executable, '-c', (
            'import ctypes, importlib, os, sys\n'
            'ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL)\n'
            'sys.setdlopenflags(os.RTLD_LAZY)\n'
            'm = importlib.import_module("cupy_backends.cuda.libs.cublas")\n'
            'print(" ".join(dir(m)))'), stub],
            capture_output=True, text=True, check=True).stdout
    return frozenset(out.split())


def _sources():
    for folder in FOLDERS:
        for path, _, files in os.walk(os.path.join(ROOT, folder)):
            for name in sorted(files):
                if name.endswith('.py'):
                    full = os.path.join(path, name)
                    with open(full) as f:
                        text = f.read()
                    yield os.path.relpath(full, ROOT), text


def _chain(node):
    """``a.b.c`` -> ['a', 'b', 'c']; an object's array module
    (``v.xp.d``, ``self._xp.d``) and ``backend.get_cupy().d`` -> ['.xp',
    'd']; None when the chain starts at anything else."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Call):
        f = _chain(node.func)
        if not f or f[-1] not in _GETTERS:
            return None
        parts.append('.xp' if _GETTERS[f[-1]] == 'cupy' else 'nccl')
    elif isinstance(node, ast.Name):
        parts.append(node.id)
    else:
        return None
    parts.reverse()
    if len(parts) > 1 and parts[1] in ('xp', '_xp'):
        parts[:2] = ['.xp']
    return parts


def _bindings(scope):
    """Names bound to cupy / nccl / cupy.cuda.runtime inside ``scope``;
    a name assigned anything else there is not one."""
    names = dict(_CONVENTIONS)
    for node in ast.walk(scope):
        if not isinstance(node, ast.Assign):
            continue
        targets = [t for tg in node.targets for t in
                   (tg.elts if isinstance(tg, ast.Tuple) else [tg])]
        value = node.value
        kinds = [None] * len(targets)
        if isinstance(value, ast.Call):
            fn = _chain(value.func) or ['']
            if fn[-1] in _GETTERS:
                kinds = [_GETTERS[fn[-1]]]
        elif isinstance(value, ast.Attribute):
            c = _chain(value)
            if c and c[-1] == 'runtime':
                kinds = ['runtime']
            elif c == ['.xp']:
                kinds = ['cupy']
        for t, kind in zip(targets, kinds):
            if isinstance(t, ast.Name):
                if kind:
                    names[t.id] = kind
                else:
                    names.pop(t.id, None)
    names['.xp'] = 'cupy'
    return names


def _scopes(tree):
    """Module level and each top-level function or method, innermost
    bindings winning."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.Module)):
            yield node


def uses(sources):
    """(file:line, root kind, (attributes...), call arity or None) of every
    use in ``sources`` ((name, text) pairs)."""
    found = []
    for rel, text in sources:
        tree = ast.parse(text, rel)
        for node in ast.walk(tree):
            for child in ast.iter_child_nodes(node):
                child._parent = node
        for scope in _scopes(tree):
            names = _bindings(scope)
            body = scope.body if isinstance(scope, ast.Module) else [scope]
            for top in body:
                if isinstance(scope, ast.Module) and isinstance(
                        top, (ast.FunctionDef, ast.ClassDef)):
                    continue
                for node in ast.walk(top):
                    found.extend(_use(rel, node, names))
        for m in re.finditer(r"'(NCCL_[A-Z0-9_]+)'", text):
            line = text[:m.start()].count('\n') + 1
            found.append(('{}:{}'.format(rel, line), 'nccl', [m.group(1)],
                          None))
    return sorted(set((w, k, tuple(a), n) for w, k, a, n in found),
                  key=str)


def _use(rel, node, names):
    where = '{}:{}'.format(rel, getattr(node, 'lineno', '?'))
    if isinstance(node, ast.Attribute) and not isinstance(
            getattr(node, '_parent', None), ast.Attribute):
        c = _chain(node)
        if c and c[0] in names and len(c) > 1:
            yield where, names[c[0]], c[1:], None
        elif isinstance(node.value, ast.Call):  # cupy.cuda.Device(i).attr
            f = _chain(node.value.func)
            if f and f[0] in names:
                yield where, names[f[0]], f[1:] + ['()', node.attr], None
        elif c and len(c) >= 2 and c[-2].endswith('nccl_comm'):
            yield where, 'communicator', [c[-1]], None
        elif c and len(c) == 2 and c[0] == 'stream':
            yield where, 'stream', [c[1]], None
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        c = _chain(node.func)
        if c and len(c) >= 2 and c[-2].endswith('nccl_comm'):
            yield where, 'communicator', [c[-1]], len(node.args)


def _roots():
    nccl = _nccl()
    return {'cupy': cupy, 'nccl': nccl, 'runtime': cupy.cuda.runtime,
            'communicator': nccl.NcclCommunicator,
            'stream': cupy.cuda.Stream.null,
            'cublas': type('cublas', (), dict.fromkeys(cublas_names()))}


def _resolve(obj, attrs):
    for a in attrs:
        if a == '()':
            if not isinstance(obj, type):
                return obj  # a function's result: not followed
            continue  # a class called: look at its attributes
        if not hasattr(obj, a):
            return AttributeError(a)
        obj = getattr(obj, a)
    return obj


def _arity(method):
    """(min, max) positional arguments of a Cython method, from the
    TypeError it raises when called with none (nothing runs)."""
    cls = _nccl().NcclCommunicator
    try:
        method(cls.__new__(cls))
    except TypeError as e:
        m = re.search(r'takes (exactly|at least|at most) (\d+)', str(e))
        if m:
            n = int(m.group(2))
            return {'exactly': (n, n), 'at least': (n, 99),
                    'at most': (0, n)}[m.group(1)]
    return None


def problems(found):
    """What in ``found`` (from :func:`uses`) the installed CuPy lacks."""
    roots = _roots()
    missing = []
    for where, kind, attrs, nargs in found:
        got = _resolve(roots[kind], attrs)
        if isinstance(got, AttributeError):
            missing.append('{}: {}.{}'.format(where, kind, '.'.join(attrs)))
        elif kind == 'communicator' and nargs:
            low, high = _arity(getattr(roots[kind], attrs[0])) or (0, 99)
            if not low <= nargs <= high:
                missing.append('{}: NcclCommunicator.{} takes {}-{} '
                               'arguments, the call passes {}'.format(
                                   where, attrs[0], low, high, nargs))
    return missing


def test_every_cupy_name_used_exists():
    found = uses(_sources())
    kinds = {k for _, k, _, _ in found}
    assert {'cupy', 'nccl', 'runtime', 'communicator', 'stream',
            'cublas'} <= kinds, kinds  # the scan sees every kind of use
    assert not problems(found), '\n'.join(problems(found))


# Attributes of arrays and memory that minichain's GPU path reads (on
# objects the scan above cannot type): wire.data.ptr, x.device.id, ...
_ARRAY_ATTRIBUTES = ('data', 'device', 'get', 'set', 'view', 'astype',
                     'reshape', 'ravel', 'nbytes', 'itemsize', 'dtype')


def test_the_fakes_of_the_unit_tests_have_only_real_names():
    """tests/test_backend.py fakes CuPy's cuBLAS module (no GPU there):
    with a name CuPy lacks, set_tf32 passed its test and crashed on the
    first device (CUBLAS_TF32_TENSOR_OP_MATH, which CuPy 14.2 lacks)."""
    from tests.test_backend import FAKE_CUBLAS_NAMES
    assert set(FAKE_CUBLAS_NAMES) <= cublas_names(), \
        set(FAKE_CUBLAS_NAMES) - cublas_names()
    assert 'CUBLAS_TF32_TENSOR_OP_MATH' not in cublas_names()  # the reason


def test_array_attributes_exist():
    assert all(hasattr(cupy.ndarray, a) for a in _ARRAY_ATTRIBUTES)
    assert hasattr(cupy.cuda.MemoryPointer, 'ptr')
    assert all(hasattr(cupy.cuda.Stream, a)
               for a in ('__enter__', '__exit__', 'synchronize'))


def test_planted_misuses_are_reported():
    text = """
from minichain import backend
def f(self, x):
    cupy = backend.get_cupy()
    cupy.cuda.Devise(0)
    cupy.cuda.Device(0).pci_bus
    xp = backend.get_array_module(x)
    xp.zeroes(3)
    self._nccl_comm.allReduce(1, 2, 3)
    from cupy_backends.cuda.libs import cublas
    cublas.setMathMode(0, cublas.CUBLAS_TF32_TENSOR_OP_MATH)
    return 'NCCL_FLOAT12'
"""
    found = problems(uses([('planted.py', text)]))
    assert len(found) == 6, found
    assert any('allReduce takes 6-6 arguments, the call passes 3' in f
               for f in found), found
