"""Every CUDA kernel of minichain compiles with NVRTC, without a GPU.

Run by ``make cuda-check`` (in ``.venv-cuda``: CuPy, NVRTC and the CUDA
headers from PyPI); skipped where CuPy is not installed. Each launch shape
of ``variants.py`` goes through CuPy's own code generator and compiler
options (``offline.py``) for sm_80 and sm_90, with 32- and 64-bit
indexing; a planted syntax error must be rejected the same way.
"""
import ast
import os

import numpy
import pytest

cupy = pytest.importorskip(
    'cupy', reason='CuPy is not installed; `make cuda-check` compiles the '
    'kernels in .venv-cuda')

from minichain import backend  # noqa: E402
from minichain.kernels.cuda import _elementwise as _cuda_kernels  # noqa: E402
from tests.cuda import offline, variants  # noqa: E402

ARCHS = ('80', '90')
INDEX = {'i32': True, 'i64': False}
LAUNCHES = list(variants.launches())
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def _compile(kind, kernel, args, index32, extra):
    return getattr(offline, kind if kind != 'cub' else 'cub_reduction')(
        kernel, args, index32=index32, **extra)


@pytest.mark.parametrize('index', sorted(INDEX))
@pytest.mark.parametrize('arch', ARCHS)
@pytest.mark.parametrize('launch', LAUNCHES, ids=[v[0] for v in LAUNCHES])
def test_kernel_compiles(launch, arch, index):
    _, kind, kernel, args, extra = launch
    with offline.offline(arch):
        cubin = _compile(kind, kernel, args, INDEX[index], extra)
    assert offline.cubin_arch(cubin) == int(arch)


def _broken(operation):
    assert 'best = v;' in operation
    return operation.replace('best = v;', 'best = v +* ;')


@pytest.mark.parametrize('arch', ARCHS)
def test_planted_errors_are_rejected(arch):
    """The same path rejects a syntax error in a kernel body and in a
    reduction expression (so a passing compile means something)."""
    in_params, out_params, operation = _cuda_kernels.SPECS['max_fwd']
    bad = cupy.ElementwiseKernel(in_params, out_params, _broken(operation),
                                 'minichain_planted')
    args = variants._im2col_args('float32')['max_fwd']
    red = cupy.ReductionKernel('T x', 'float32 y', 'x +* ', 'a + b',
                               'y = a', '0', 'minichain_planted_sum',
                               reduce_type='float')
    with offline.offline(arch):
        with pytest.raises(offline.CompileException,
                           match='expected an expression'):
            offline.elementwise(bad, args, True)
        with pytest.raises(offline.CompileException,
                           match='expected an expression'):
            offline.reduction(red, [offline.array('float32', 2),
                                    offline.array('float32')], 2, 1, True)
        with pytest.raises(offline.CompileException):
            offline.cub_reduction(red, [offline.array('float32', 2),
                                        offline.array('float32')], True)


_KERNEL_CLASSES = ('ElementwiseKernel', 'ReductionKernel', 'RawKernel',
                   'RawModule', 'fuse')
# where minichain builds kernels -> the factory variants.py calls
_FACTORIES = {('minichain/kernels/cuda/_elementwise.py', 'make_kernel'),
              ('minichain/kernels/cuda/normalization.py', 'make_kernels'),
              ('minichain/kernels/cuda/optimizers.py', 'make_kernel'),
              ('minichain/kernels/cuda/optimizers.py', 'make_kernel_all')}


def _kernel_constructions():
    """(file, enclosing top-level function, class) of every call that
    builds a CuPy kernel in minichain's source."""
    found = set()
    for folder, _, files in os.walk(os.path.join(ROOT, 'minichain')):
        for name in files:
            if not name.endswith('.py'):
                continue
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, ROOT)
            with open(path) as f:
                tree = ast.parse(f.read(), rel)
            for top in tree.body:
                for node in ast.walk(top):
                    if (isinstance(node, ast.Call)
                            and isinstance(node.func, ast.Attribute)
                            and node.func.attr in _KERNEL_CLASSES):
                        found.add((rel, getattr(top, 'name', None),
                                   node.func.attr))
    return found


def test_every_kernel_source_is_compiled_here():
    built = _kernel_constructions()
    assert built, 'no kernel construction found: the scan is broken'
    assert {(f, fn) for f, fn, _ in built} <= _FACTORIES, built
    names = {k.name for _, _, k, _, _ in LAUNCHES}
    want = {'minichain_' + n for n in _cuda_kernels.SPECS} | {
        'minichain_bn_' + n for n in ('fwd', 'fwd_add', 'bwd', 'sum',
                                      'sq_dev', 'dot_dev', 'stats',
                                      'bwd_stats')} | {
        'minichain_momentum_sgd', 'minichain_momentum_sgd_all'}
    assert names == want
    kinds = {(k.name, kind) for _, kind, k, _, _ in LAUNCHES}
    dtypes = {(k.name, a[0][1].name) for _, _, k, a, _ in LAUNCHES}
    assert ('minichain_bn_sum', 'cub') in kinds
    assert dtypes == {(n, t) for n in want for t in variants.FLOATS}


@pytest.mark.gpu
@pytest.mark.skipif(not backend.gpu_available(), reason='no CUDA GPU')
def test_sources_built_here_equal_what_cupy_generates_on_a_device():
    """On a GPU: run the functions, then every source CuPy generated for
    minichain's kernels must be one that ``offline`` generates (so the
    launch shapes of variants.py are the real ones)."""
    from minichain import Variable
    from minichain import functions as F, kernels, optimizers
    from minichain.kernels.cuda import normalization as K
    from minichain.kernels.cuda import optimizers as O
    from tests._holder import Holder
    ours = set()
    for _, kind, kernel, args, extra in LAUNCHES:
        for index32 in (True, False):
            if kind == 'elementwise':
                ours.add(offline.elementwise(kernel, args, index32, False))
            elif kind == 'reduction':  # CuPy's block size depends on size
                ours.update(offline.reduction(
                    kernel, args, index32=index32, block_size=2 ** b,
                    compile=False, **extra) for b in range(11))
    rng = numpy.random.default_rng(0)
    for t in variants.FLOATS:
        x = Variable(cupy.asarray(rng.standard_normal((2, 3, 6, 5))
                                  .astype(t)))
        y = F.max_pooling_2d(x, 3, 2, 1)
        y.grad = cupy.ones(y.shape, t)
        y.backward(enable_double_backprop=True)
        F.sum(x.grad_var * x.grad_var).backward()  # the gather kernel
        F.sum(F.average_pooling_2d(x, 2)).backward()
        F.sum(F.convolution_2d(x, cupy.ones((2, 3, 3, 3), t),
                               pad=1)).backward()
        gamma, beta = cupy.ones(3, t), cupy.zeros(3, t)
        for xin in (x, x.array[:, :, 0, 0].copy()):
            bn = F.batch_normalization(xin, gamma, beta)
            F.sum(bn * bn).backward()
        link = Holder(w=numpy.ones((3, 2), t))
        link.to_gpu(0)
        for wd in (0, 1e-4):
            opt = optimizers.MomentumSGD(weight_decay_rate=wd).setup(link)
            link.w.grad = cupy.ones((3, 2), t)
            opt.update()                                # all at once
            kernels.update(link.w.update_rule, link.w)  # one parameter
    seen = [(k.name, code) for k in _cuda_kernels._kernels.values()
            for code in k._cached_codes.values()]
    seen += [(k.name, code) for k in O._kernel + O._kernel_all
             for code in k._cached_codes.values()]
    seen += [(k.name, code) for ks in K._gpu_kernels.values()
             for k in ks.values() for code in k._cached_codes.values()]
    assert len({n for n, _ in seen}) >= 8, sorted({n for n, _ in seen})
    strays = [n for n, code in seen if code not in ours]
    assert not strays, strays
