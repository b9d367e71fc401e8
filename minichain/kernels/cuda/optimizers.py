"""MomentumSGD's update on CuPy in one launch per parameter
(optimizers/momentum_sgd.py): the body's four CuPy calls (six with weight
decay) fused into one ElementwiseKernel that reads the parameter, its
gradient and velocity once. The roundings are the body's, in its order:
every product and sum rounded to T as one CuPy ufunc rounds it (the
``__f*_rn`` intrinsics keep NVRTC from fusing a multiply and an add into
an FMA, which rounds once where the body rounds twice), so the result is
the body's bit for bit (tests/kernels/test_cuda_optimizers.py).

A whole step takes one launch per device and dtype (:func:`momentum_sgd_all`,
behind ``kernels.UpdateAll``): one thread per element of all parameters
together, which finds its parameter by bisection in a table of element
counts and device pointers (p, g, v) uploaded each step (the gradients are
new arrays each step), then does the same arithmetic.
"""
import numpy

from minichain import backend, kernels
from minichain.optimizers.momentum_sgd import MomentumSGDRule

# float16: CuPy's class rounds each operation to float16; float and
# double: the intrinsics (on the CPU emulation of the tests, the template's
# plain operations, which x86-64 does not fuse)
_PREAMBLE = '''
template <typename U> __device__ U mul(U a, U b) { return a * b; }
template <typename U> __device__ U add(U a, U b) { return a + b; }
template <typename U> __device__ U sub(U a, U b) { return a - b; }
#ifdef __CUDACC__
__device__ float mul(float a, float b) { return __fmul_rn(a, b); }
__device__ float add(float a, float b) { return __fadd_rn(a, b); }
__device__ float sub(float a, float b) { return __fsub_rn(a, b); }
__device__ double mul(double a, double b) { return __dmul_rn(a, b); }
__device__ double add(double a, double b) { return __dadd_rn(a, b); }
__device__ double sub(double a, double b) { return __dsub_rn(a, b); }
#endif
'''

# step = lr * (g + wd * p) or lr * g; v = mu * v - step; p = p + v
_MOMENTUM_SGD = '''
    const T step = decay ? mul(add(mul(p, wd), g), lr) : mul(g, lr);
    v = sub(mul(v, mu), step);
    p = add(p, v);
'''

# Element i of parameter k: rows of ``table`` are (end, decay, &p, &g, &v),
# ``end`` the running count of elements; ``hp`` holds (lr, mu, wd) per row.
_FIND = '''
    int k = 0;
    for (int hi = n - 1; k < hi;) {
        const int mid = (k + hi) / 2;
        if (table[5 * mid] <= i) k = mid + 1; else hi = mid;
    }
    const long long j = i - (k ? table[5 * k - 5] : 0);
    T& p = reinterpret_cast<T*>(table[5 * k + 2])[j];
    const T g = reinterpret_cast<const T*>(table[5 * k + 3])[j];
    T& v = reinterpret_cast<T*>(table[5 * k + 4])[j];
    const T lr = hp[3 * k], mu = hp[3 * k + 1], wd = hp[3 * k + 2];
    const bool decay = table[5 * k + 1];
'''

_kernel = []
_kernel_all = []


def make_kernel(cupy):
    """The ``cupy.ElementwiseKernel`` of the update (compiled at its first
    call, per dtype); also called by ``tests/cuda`` to compile it without
    a GPU."""
    return cupy.ElementwiseKernel(
        'T g, T lr, T mu, T wd, bool decay', 'T p, T v', _MOMENTUM_SGD,
        'minichain_momentum_sgd', preamble=_PREAMBLE)


def make_kernel_all(cupy):
    """The one-launch update of many parameters (their table is its raw
    output: CuPy wants one, and the kernel writes through its pointers);
    called as ``kernel(hp, n, table, size=elements)``."""
    return cupy.ElementwiseKernel(
        'raw T hp, int32 n', 'raw int64 table', _FIND + _MOMENTUM_SGD,
        'minichain_momentum_sgd_all', preamble=_PREAMBLE)


def _ptr(array):
    return array.data.ptr


def _fits(rule, param, seen):
    """Whether the one-launch update takes this pair as ``rule.update``
    would update it: MomentumSGD's own rule, C-contiguous CuPy arrays of
    one float dtype and shape, a parameter not already in the step."""
    p, g = param.array, param.grad
    v = p if rule.state is None else rule.state['v']  # prepare makes it
    ok = (type(rule) is MomentumSGDRule and g is not None
          and kernels.on_cupy((p, g, v)) and p.dtype.kind == 'f'
          and p.dtype == g.dtype == v.dtype and p.shape == g.shape == v.shape
          and p.flags.c_contiguous and g.flags.c_contiguous
          and v.flags.c_contiguous)
    # the same memory twice would race in one launch; an empty array's
    # pointer may be any other array's
    key = (_ptr(p) if p.size else id(p)) if ok else None
    ok = ok and key not in seen
    seen.add(key)
    return ok


def momentum_sgd_all(pairs):
    """Update the MomentumSGD parameters among ``pairs`` on CuPy, one
    launch per device and dtype; returns the pairs it did not take."""
    groups, rest, seen = {}, [], set()
    for rule, param in pairs:
        if _fits(rule, param, seen):
            a = param.array
            groups.setdefault((a.device.id, a.dtype), []).append(
                (rule, param))
        else:
            rest.append((rule, param))
    for (device, dtype), group in groups.items():
        with backend.cuda_device(device):
            launch_all([(r, p) for r, p in group if r.prepare(p)], dtype)
    return rest


def launch_all(group, dtype):
    """One launch of the update over the prepared ``(rule, param)`` pairs
    of ``group`` (arrays of ``dtype`` on the current device)."""
    if not group:
        return
    cupy = backend.get_cupy()
    if not _kernel_all:
        _kernel_all.append(make_kernel_all(cupy))
    table = numpy.empty((len(group), 5), numpy.int64)
    hp = numpy.empty((len(group), 3), dtype)
    for k, (rule, param) in enumerate(group):
        h = rule.hyperparam
        table[k] = (param.array.size, bool(h.weight_decay_rate),
                    _ptr(param.array), _ptr(param.grad),
                    _ptr(rule.state['v']))
        hp[k] = h.lr, h.momentum, h.weight_decay_rate
    numpy.cumsum(table[:, 0], out=table[:, 0])
    # (1-D, as the kernel indexes them and tests/cuda compiles it)
    _kernel_all[0](cupy.asarray(hp.ravel()), len(group),
                   cupy.asarray(table.ravel()), size=int(table[-1, 0]))


def momentum_sgd(rule, param):
    """Update ``param`` in place as ``MomentumSGDRule.update_core`` does;
    True when done, None to decline (not CuPy, or mixed dtypes or
    shapes)."""
    p, g, v = param.array, param.grad, rule.state['v']
    if not (kernels.on_cupy((p, g, v)) and p.dtype.kind == 'f'
            and p.dtype == g.dtype == v.dtype
            and p.shape == g.shape == v.shape):
        return None
    if not _kernel:
        _kernel.append(make_kernel(backend.get_cupy()))
    hp = rule.hyperparam
    wd = hp.weight_decay_rate
    _kernel[0](g, hp.lr, hp.momentum, wd, bool(wd), p, v)
    return True


kernels.register(MomentumSGDRule, 'cuda', momentum_sgd)
kernels.register(kernels.UpdateAll, 'cuda', momentum_sgd_all)
