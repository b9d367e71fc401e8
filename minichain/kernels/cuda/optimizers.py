"""MomentumSGD's update on CuPy in one launch per parameter
(optimizers/momentum_sgd.py): the body's four CuPy calls (six with weight
decay) fused into one ElementwiseKernel that reads the parameter, its
gradient and velocity once. The roundings are the body's, in its order:
every product and sum rounded to T as one CuPy ufunc rounds it (the
``__f*_rn`` intrinsics keep NVRTC from fusing a multiply and an add into
an FMA, which rounds once where the body rounds twice), so the result is
the body's bit for bit (tests/kernels/test_cuda_optimizers.py).
"""
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

_kernel = []


def make_kernel(cupy):
    """The ``cupy.ElementwiseKernel`` of the update (compiled at its first
    call, per dtype); also called by ``tests/cuda`` to compile it without
    a GPU."""
    return cupy.ElementwiseKernel(
        'T g, T lr, T mu, T wd, bool decay', 'T p, T v', _MOMENTUM_SGD,
        'minichain_momentum_sgd', preamble=_PREAMBLE)


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
