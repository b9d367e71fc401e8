"""GPU checks (pure_nccl, hierarchical): ``mpiexec -n K gpu.py MODE``.

MODE ``single`` (K = 1): NCCL unique-ID broadcast and communicator, CuPy
gradients equal NumPy gradients, float16/bfloat16 transfer (and planted NaN
of CUDA's patterns caught after it), hierarchical, double buffering,
MultiNodeBatchNormalization on the GPU, finalize waiting for the GPU.
MODE ``overlap`` (K = 1): overlapped averaging on the GPU (NCCL on a side
stream for pure_nccl and hierarchical, staged through the host for flat)
equals averaging after backward, in float32 and with float16/bfloat16
transfer within their tolerance; accumulate=2 equals the double batch.
MODE ``overlap2`` (K = 2, a GPU each): bfloat16 overlapped averaging of
different gradients equals their true mean within bfloat16's tolerance.
MODE ``shared`` (K = 2 on one GPU): the clear one-GPU-per-rank error.
MODE ``exit`` (K = 1): a communicator never finalized is torn down at exit.
MODE ``auto`` (any K, no GPU needed): 'auto' says once, on rank 0, why it
did not pick NCCL.
Prints ``GPU-OK <rank>`` (``OVERLAP-OK <rank>``, ``OVERLAP2-OK <rank>``,
``SHARED-OK <rank>``, ``EXIT-OK``, ``AUTO-OK <rank>``) on success.
"""
import atexit
import os
import sys
import time

import numpy

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from minichain import backend, device, dist, optimizers  # noqa: E402
from minichain import functions as F  # noqa: E402

import _models as M  # noqa: E402

cupy = None

# A kernel that keeps a stream busy for a given number of clock cycles:
# finalize must wait for it.
_SPIN = r"""
extern "C" __global__ void spin(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) { }
}
"""


def _gpu(comm):
    global cupy
    cupy = backend.get_cupy()
    return device.get_rank_device(comm.intra_rank, comm.intra_size)


def grads_of(model, x, t):
    model.cleargrads()
    F.softmax_cross_entropy(model(x), t).backward()
    return {n: backend.to_cpu(p.grad) for n, p in model.namedparams()}


def _nan_grads(model, pattern):
    for _, p in model.namedparams():
        g = cupy.zeros(p.shape, numpy.float32)
        g.ravel()[0:1] = cupy.asarray(numpy.array([pattern], numpy.uint32)
                                      .view(numpy.float32))
        p.grad = g


def _expect_nan_caught(comm, model, pattern, what):
    _nan_grads(model, pattern)
    try:
        comm.multi_node_mean_grad(model)
    except FloatingPointError as e:
        assert 'inf or NaN' in str(e), e
        return
    raise AssertionError('{}: NaN 0x{:08X} went through the transfer as {}'
                         .format(what, pattern, [
                             backend.to_cpu(p.grad).ravel()[0]
                             for _, p in model.namedparams()]))


def single():
    comm = dist.create_communicator('pure_nccl')
    assert type(dist.create_communicator('auto')).__name__ == \
        'PureNcclCommunicator'
    dev = _gpu(comm)
    assert dev.device_id == 0 and cupy.cuda.Device().id == 0
    rng = numpy.random.default_rng(0)
    x = rng.standard_normal((6, 5)).astype(numpy.float32)
    t = rng.integers(0, 3, 6).astype(numpy.int32)
    cpu = M.MLP()
    gpu = M.MLP()
    gpu.copyparams(cpu)
    gpu.to_gpu(comm.intra_rank)
    flat = dist.create_communicator('flat')
    want = grads_of(cpu, x, t)
    flat.multi_node_mean_grad(cpu)
    for name in ('pure_nccl', 'hierarchical', 'flat', 'ring'):
        c = dist.create_communicator(name)
        grads_of(gpu, cupy.asarray(x), cupy.asarray(t))
        c.multi_node_mean_grad(gpu)
        for n, p in gpu.namedparams():
            assert isinstance(p.grad, cupy.ndarray), (name, n)
            assert numpy.allclose(backend.to_cpu(p.grad), want[n],
                                  rtol=1e-5, atol=1e-6), (name, n)
    for dtype, tol in (('float16', 2e-3), ('bfloat16', 1e-2)):
        c = dist.create_communicator('pure_nccl', allreduce_grad_dtype=dtype)
        grads_of(gpu, cupy.asarray(x), cupy.asarray(t))
        c.multi_node_mean_grad(gpu)
        for n, p in gpu.namedparams():
            assert p.grad.dtype == numpy.float32
            assert numpy.allclose(backend.to_cpu(p.grad), want[n], rtol=tol,
                                  atol=tol), (dtype, n)
    c16 = dist.create_communicator('pure_nccl', allreduce_grad_dtype='float16')
    gpu.l1.W.grad = cupy.full(gpu.l1.W.shape, 1e6, dtype=numpy.float32)
    try:
        c16.multi_node_mean_grad(gpu)
        raise AssertionError('float16 overflow was not reported')
    except FloatingPointError as e:
        assert 'inf or NaN' in str(e)
    # NaN in CUDA's bit patterns (the bfloat16 rounding used to make them
    # +-0.0 and let them through), in both narrow transfers and both NCCL
    # communicators
    for name in ('pure_nccl', 'hierarchical'):
        for wire in ('bfloat16', 'float16'):
            c = dist.create_communicator(name, allreduce_grad_dtype=wire)
            for pattern in (0x7FFFFFFF, 0xFFFFFFFF, 0x7FC00000, 0x7F800001):
                _expect_nan_caught(c, gpu, pattern, name + ' ' + wire)
            c.finalize()
    # Double buffering: update 1 broadcasts, update 2 only launches the
    # allreduce, update 3 applies update 2's gradients (one step stale).
    start = {n: backend.to_cpu(p.array).copy() for n, p in gpu.namedparams()}
    opt = dist.create_multi_node_optimizer(optimizers.SGD(lr=0.5), comm,
                                           double_buffering=True).setup(gpu)
    xs = [cupy.asarray(rng.standard_normal((6, 5)).astype(numpy.float32))
          for _ in range(3)]
    for k in range(3):
        opt.update(lambda: F.softmax_cross_entropy(gpu(xs[k]),
                                                   cupy.asarray(t)))
    assert opt.t == 1, opt.t
    for n, p in cpu.namedparams():
        p.array[...] = start[n]
    g2 = grads_of(cpu, backend.to_cpu(xs[1]), t)
    for n, p in gpu.namedparams():
        assert numpy.allclose(backend.to_cpu(p.array), start[n] - 0.5 * g2[n],
                              rtol=1e-4, atol=1e-5), n
    # Synchronized batch normalization on the GPU equals the CPU result.
    xb = rng.standard_normal((4, 3, 2, 2)).astype(numpy.float32)
    bn_c = dist.MultiNodeBatchNormalization(3, flat)
    bn_g = dist.MultiNodeBatchNormalization(3, comm).to_gpu()
    y_c, y_g = bn_c(xb), bn_g(cupy.asarray(xb))
    assert numpy.allclose(backend.to_cpu(y_g.array), y_c.array, atol=1e-5)
    F.sum(y_g * y_g).backward()
    assert isinstance(bn_g.gamma.grad, cupy.ndarray)
    r = comm.allreduce(cupy.arange(3.0))  # float64 sum: NCCL, on the GPU
    assert isinstance(r, cupy.ndarray)
    assert numpy.array_equal(r.get(), comm.size * numpy.arange(3.0))
    m = comm.allreduce(cupy.full(4, 2.0, cupy.float32), 'mean')
    assert m.dtype == numpy.float32 and (m.get() == 2.0).all()
    i = comm.allreduce(cupy.arange(3), 'max')  # integers: the host path
    assert isinstance(i, cupy.ndarray) and (i.get() == numpy.arange(3)).all()
    # finalize waits for every stream: here a kernel busy for ~0.3 s on a
    # stream of its own, launched just before
    side = cupy.cuda.Stream(non_blocking=True)
    spin = cupy.RawKernel(_SPIN, 'spin')
    rate = cupy.cuda.runtime.getDeviceProperties(0)['clockRate'] * 1e3
    with side:
        spin((1,), (1,), (numpy.int64(0.3 * rate),))
    start = time.monotonic()
    comm.finalize()
    assert side.done, 'finalize returned with a stream still busy'
    assert comm.nccl_comm is None
    comm.finalize()  # again: nothing to do
    print('GPU-OK', comm.rank, 'finalize waited {:.2f} s'.format(
        time.monotonic() - start), flush=True)


def shared():
    comm = dist.create_communicator('pure_nccl')
    _gpu(comm)  # one visible GPU: every rank takes GPU 0, the mistake
    model = M.MLP().to_gpu(0)
    for _, p in model.namedparams():
        p.grad = cupy.ones(p.shape, dtype=p.dtype)
    try:
        comm.multi_node_mean_grad(model)
    except RuntimeError as e:
        assert 'one GPU per rank' in str(e), e
        msgs = comm.allgather_obj(str(e))
        assert all(m == msgs[0] for m in msgs)
        print('SHARED-OK {}'.format(comm.rank), flush=True)
        return
    raise AssertionError('two ranks on one GPU were not reported')


def exit_():
    comm = dist.create_communicator('pure_nccl')
    _gpu(comm)
    # registered before NCCL starts, so it runs after minichain's handler
    atexit.register(lambda: print('EXIT-OK' if comm.nccl_comm is None
                                  else 'EXIT-NCCL-LEFT', flush=True))
    r = comm.allreduce(cupy.ones(1 << 20, cupy.float32))
    assert r.dtype == numpy.float32 and comm.nccl_comm is not None


def _overlap_run(name, dtype, x, t, **options):
    comm = dist.create_communicator(name, allreduce_grad_dtype=dtype)
    model = M.MLP()
    model.to_gpu(comm.intra_rank)
    opt = dist.create_multi_node_optimizer(optimizers.MomentumSGD(lr=0.1),
                                           comm, **options).setup(model)
    opt.update()
    k = options.get('accumulate', 1)
    n = len(x) // k
    for _ in range(3):
        for j in range(k):
            opt.update(lambda: F.softmax_cross_entropy(
                model(x[j * n:(j + 1) * n]), t[j * n:(j + 1) * n]))
    if options.get('overlap'):
        assert opt.reducer.launched_in_backward == len(
            opt.reducer.plan.buckets) > 2, name
    out = [backend.to_cpu(p.array) for p in model.params()]
    comm.finalize()
    return out


def overlap():
    comm = dist.create_communicator('pure_nccl')
    _gpu(comm)
    rng = numpy.random.default_rng(1)
    x = cupy.asarray(rng.standard_normal((8, 5)).astype(numpy.float32))
    t = cupy.asarray(rng.integers(0, 3, 8).astype(numpy.int32))
    tiny = {'overlap': True, 'bucket_mb': 1e-4}
    for name in ('pure_nccl', 'hierarchical', 'flat'):
        want = _overlap_run(name, None, x, t)
        wires = ((None, 1e-6),) + ((('float16', 2e-3), ('bfloat16', 1e-2))
                                   if name != 'flat' else ())
        for dtype, tol in wires:
            for options in (tiny, dict(tiny, accumulate=2)):
                got = _overlap_run(name, dtype, x, t, **options)
                for g, w in zip(got, want):
                    assert numpy.allclose(g, w, rtol=tol, atol=tol), (
                        name, dtype, options, float(abs(g - w).max()))
    print('OVERLAP-OK {}'.format(comm.rank), flush=True)


def auto():
    for _ in range(3):
        comm = dist.create_communicator('auto')
    if type(comm).__name__ == 'PureNcclCommunicator':
        print('AUTO-NCCL {}'.format(comm.rank), flush=True)
        return
    comm.mpi_comm.Barrier()  # every rank has created its communicators
    print('AUTO-OK {}'.format(comm.rank), flush=True)  # one write


def overlap2():
    """K = 2, a GPU each: bfloat16 overlapped averaging of different
    gradients on each rank against their true mean (float64, on the host)."""
    comm = dist.create_communicator('pure_nccl')
    dev = _gpu(comm)
    rng = numpy.random.default_rng(10 + comm.rank)  # each rank its batch
    x = cupy.asarray(rng.standard_normal((8, 5)).astype(numpy.float32))
    t = cupy.asarray(rng.integers(0, 3, 8).astype(numpy.int32))
    model = M.MLP()
    model.to_gpu(dev.device_id)
    bf16 = dist.create_communicator('pure_nccl',
                                    allreduce_grad_dtype='bfloat16')
    opt = dist.create_multi_node_optimizer(
        optimizers.SGD(lr=0.0), bf16, overlap=True, bucket_mb=1e-4
    ).setup(model)
    opt.update()  # rank 0's parameters everywhere
    local = grads_of(model, x, t)
    true = {n: comm.allreduce(g.astype(numpy.float64), 'mean')
            for n, g in local.items()}
    assert any(not numpy.allclose(local[n], true[n]) for n in local)
    for _ in range(2):  # the second step reuses the buckets
        opt.update(lambda: F.softmax_cross_entropy(model(x), t))
        assert opt.reducer.launched_in_backward == len(
            opt.reducer.plan.buckets) > 2
        for n, p in model.namedparams():
            got = backend.to_cpu(p.grad)
            scale = float(numpy.abs(true[n]).max())
            assert numpy.allclose(got, true[n], rtol=1e-2,
                                  atol=1e-2 * scale), (
                n, float(abs(got - true[n]).max()), scale)
    bf16.finalize()
    comm.finalize()
    print('OVERLAP2-OK {}'.format(comm.rank), flush=True)


if __name__ == '__main__':
    {'single': single, 'overlap': overlap, 'overlap2': overlap2,
     'shared': shared, 'exit': exit_, 'auto': auto}[sys.argv[1]]()
