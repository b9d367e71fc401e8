"""A CPU stand-in for the bit of CuPy that minichain's CUDA kernels use.

``ElementwiseKernel`` here compiles a kernel's body with the host C++
compiler into ``for (i = 0; i < size; ++i) { body }`` and calls it through
ctypes on NumPy arrays. Tests patch ``backend.get_cupy`` with
:func:`fake_cupy` so that the wrappers in
``minichain.kernels.cuda._elementwise``
run unchanged: the index arithmetic of every kernel and the argument order of
every call get checked against the NumPy path on machines without a GPU.
"""
import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import types

import numpy
import pytest

CXX = shutil.which('g++') or shutil.which('c++')
_C_NAMES = {'int32': 'int', 'int64': 'long long', 'bool': 'bool',
            'float32': 'float', 'float64': 'double'}
_CTYPES = {'int': ctypes.c_int32, 'long long': ctypes.c_longlong,
           'bool': ctypes.c_bool, 'float': ctypes.c_float,
           'double': ctypes.c_double}
_libs = {}


def _parse(params):
    result = []
    for p in params.split(','):
        words = p.split()
        raw = words[0] == 'raw'
        result.append((raw,) + tuple(words[1:] if raw else words))
    return result


class ElementwiseKernel:
    """cupy.ElementwiseKernel's calling convention, executed on the CPU."""

    def __init__(self, in_params, out_params, operation, name='kernel',
                 preamble=''):
        self.ins, self.outs = _parse(in_params), _parse(out_params)
        self.operation, self.name = operation, name
        self.preamble = preamble

    def _source(self, types, is_array):
        def c_type(t):
            return types.get(t) or _C_NAMES[t]

        params, prelude = [], []
        for (raw, t, n), arr in zip(self.ins, is_array):
            if raw:
                params.append('const {}* {}'.format(c_type(t), n))
            elif arr:
                params.append('const {}* {}_arr'.format(c_type(t), n))
                prelude.append('const {0} {1} = {1}_arr[i];'.format(
                    c_type(t), n))
            else:
                params.append('{} {}'.format(c_type(t), n))
        for raw, t, n in self.outs:
            params.append('{}* {}{}'.format(c_type(t), n, '' if raw
                                            else '_arr'))
            if not raw:
                prelude.append('{0}& {1} = {1}_arr[i];'.format(c_type(t), n))
        return ('{}{}\nextern "C" void kernel({}, long long size) '
                '{{\nfor (long long i = 0; i < size; ++i) {{\n{}\n{};\n}}\n}}\n'
                .format(''.join('typedef {} {};\n'.format(c, t)
                                for t, c in sorted(types.items())),
                        self.preamble, ', '.join(params),
                        '\n'.join(prelude), self.operation))

    def __call__(self, *args, size=None):
        ins, outs = args[:len(self.ins)], args[len(self.ins):]
        if len(outs) != len(self.outs):
            raise TypeError('{}: pass every output array'.format(self.name))
        types = {}  # T (and any other type placeholder): from its arrays
        for (_, t, _), a in zip(self.ins + self.outs, args):
            if t not in _C_NAMES and isinstance(a, numpy.ndarray):
                types.setdefault(t, _C_NAMES[a.dtype.name])
        is_array = [isinstance(a, numpy.ndarray) for a in ins]
        fn = _compile(self._source(types, is_array))
        cargs = []
        for (raw, t, n), a in zip(self.ins + self.outs, args):
            c = types.get(t) or _C_NAMES[t]
            if isinstance(a, numpy.ndarray):
                assert a.flags.c_contiguous, n
                assert _C_NAMES[a.dtype.name] == c, (n, a.dtype, c)
                cargs.append(a.ctypes.data_as(ctypes.c_void_p))
            else:
                cargs.append(_CTYPES[c](a))
        fn(*cargs, ctypes.c_longlong(outs[0].size if size is None
                                     else size))


def _compile(source):
    key = hashlib.sha1(source.encode()).hexdigest()
    if key not in _libs:
        # A loaded library outlives its file, so the folder can go at once.
        with tempfile.TemporaryDirectory(prefix='minichain_cuda_emu_') as d:
            src, lib = (os.path.join(d, 'k' + ext) for ext in ('.cpp', '.so'))
            with open(src, 'w') as f:
                f.write(source)
            subprocess.run([CXX, '-O1', '-shared', '-fPIC', '-o', lib, src],
                           check=True, capture_output=True)
            _libs[key] = ctypes.CDLL(lib).kernel
    return _libs[key]


def fake_cupy():
    """The module object that ``backend.get_cupy`` returns under emulation."""
    return types.SimpleNamespace(
        ElementwiseKernel=ElementwiseKernel, empty=numpy.empty,
        ascontiguousarray=numpy.ascontiguousarray, int32=numpy.int32)


@pytest.fixture
def emulated_cuda(monkeypatch):
    """``minichain.kernels.cuda._elementwise`` running on the CPU."""
    if CXX is None:
        pytest.skip('no C++ compiler to emulate the CUDA kernels')
    from minichain import backend
    _cuda_kernels = pytest.importorskip('minichain.kernels.cuda._elementwise')
    monkeypatch.setattr(backend, 'get_cupy', fake_cupy)
    monkeypatch.setattr(_cuda_kernels, '_kernels', {})
    return _cuda_kernels
