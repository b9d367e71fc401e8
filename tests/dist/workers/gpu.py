"""GPU checks (pure_nccl, hierarchical): ``mpiexec -n K gpu.py MODE``.

MODE ``single`` (K = 1): NCCL unique-ID broadcast and communicator, CuPy
gradients equal NumPy gradients, float16/bfloat16 transfer, hierarchical,
double buffering, MultiNodeBatchNormalization on the GPU.
MODE ``shared`` (K = 2 on one GPU): the clear one-GPU-per-rank error.
Prints ``GPU-OK <rank>`` (or ``SHARED-OK <rank> <message>``) on success.
"""
import os
import sys

import numpy

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from minichain import backend, dist, optimizers  # noqa: E402
from minichain import functions as F  # noqa: E402

import _models as M  # noqa: E402

cupy = backend.get_cupy()


def grads_of(model, x, t):
    model.cleargrads()
    F.softmax_cross_entropy(model(x), t).backward()
    return {n: backend.to_cpu(p.grad) for n, p in model.namedparams()}


def single():
    comm = dist.create_communicator('pure_nccl')
    assert type(dist.create_communicator('auto')).__name__ == \
        'PureNcclCommunicator'
    cupy.cuda.Device(comm.intra_rank).use()
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
    for name in ('pure_nccl', 'hierarchical', 'flat'):
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
    comm.finalize()
    print('GPU-OK', comm.rank, flush=True)


def shared():
    comm = dist.create_communicator('pure_nccl')
    cupy.cuda.Device(0).use()  # every rank on GPU 0: the mistake to catch
    model = M.MLP().to_gpu(0)
    for _, p in model.namedparams():
        p.grad = cupy.ones(p.shape, dtype=p.dtype)
    try:
        comm.multi_node_mean_grad(model)
    except RuntimeError as e:
        assert 'one GPU per rank' in str(e), e
        msgs = comm.allgather_obj(str(e))
        assert all(m == msgs[0] for m in msgs)
        print('SHARED-OK', comm.rank, flush=True)
        return
    raise AssertionError('two ranks on one GPU were not reported')


if __name__ == '__main__':
    {'single': single, 'shared': shared}[sys.argv[1]]()
