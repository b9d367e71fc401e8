"""Batch normalization with statistics over the global (all-rank) batch.

``y = gamma * (x - mean) / sqrt(var + eps) + beta`` where ``mean`` and
``var`` are taken over every rank's batch. It is built from two pieces:

* ``_GlobalMoments``: ``x -> (mean, var)`` over all ranks. Forward: each rank
  reduces its batch to ``[count, sum, M2]`` per channel in float64 (M2 =
  sum of squared deviations from the local mean), one Allgather, and every
  rank combines them in rank order with Chan's formula
  ``M2 = sum_r M2_r + n_r (mean_r - mean)^2`` (exact for unequal local
  batch sizes, no cancellation, the same bits on every rank). On the GPU
  one allreduce of ``[sum, M2 + n mean_r^2]`` replaces the Allgather, so
  that the statistics never leave the device. Backward: one
  packed allreduce of ``[g_mean, g_var]``, then
  ``gx = (G_mean + 2 G_var (x - mean)) / N``.
* ``F.fixed_batch_normalization(x, gamma, beta, mean, var)``, which is
  differentiable in all five inputs.

So backward costs one allreduce of ``2 C`` numbers; ``gx`` is the gradient of
the sum of all ranks' losses (what data parallelism averages), while
``ggamma``/``gbeta`` are this rank's own sums, averaged later with the other
gradients by ``multi_node_mean_grad``. Every piece is differentiable, so
double backprop works too.
"""
import copy

import numpy

from minichain import backend
from minichain.configuration import config
from minichain.dist import mpi
from minichain.dist.failures import by_rank
from minichain.function_node import FunctionNode
from minichain.functions import (broadcast_to, fixed_batch_normalization,
                                 reshape)
from minichain.functions._check import check_float, unwrap
from minichain.functions.normalization import then_add_relu
from minichain.links import BatchNormalization
from minichain.links.normalization import running_statistics_guard
from minichain.variable import Variable

__all__ = ['MultiNodeBatchNormalization', 'multi_node_batch_normalization',
           'create_mnbn_model']


def _reduced_axes(x_ndim, gamma_ndim, axis):
    if axis is None:
        return (0,) + tuple(range(1 + gamma_ndim, x_ndim))
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    return tuple(sorted(a % x_ndim for a in axes))


class AllreduceSum(FunctionNode):
    """``(a, b, ...) -> (sum over ranks of a, ...)``, packed in one float64
    message (``comm.allreduce``: on the GPU with ``pure_nccl``, through host
    memory otherwise). Its gradient is again an allreduce-sum of the output
    gradients (each rank's loss depends on every rank's inputs)."""

    def __init__(self, comm):
        self.comm = comm

    def forward(self, inputs):
        xp = self._xp = backend.get_array_module(inputs[0])
        self.metas = [(a.shape, a.dtype) for a in inputs]
        total = self.comm.allreduce(xp.concatenate(
            [a.astype(numpy.float64).ravel() for a in inputs]))
        out, offset = [], 0
        for (shape, dtype), a in zip(self.metas, inputs):
            out.append(total[offset:offset + a.size].reshape(shape)
                       .astype(dtype))
            offset += a.size
        return tuple(out)

    def backward(self, indexes, grad_outputs):
        gys = [g if g is not None else Variable(self._xp.zeros(shape, dtype))
               for g, (shape, dtype) in zip(grad_outputs, self.metas)]
        return AllreduceSum(self.comm).apply(gys)


class _GlobalMoments(FunctionNode):
    """``x -> (mean, var)`` per channel over all ranks' batches."""

    def __init__(self, comm, axes):
        self.comm, self.axes = comm, axes

    def forward(self, inputs):
        x, = inputs
        self.retain_inputs((0,))
        self.retain_outputs((0,))
        xp = backend.get_array_module(x)
        kept = [i for i in range(x.ndim) if i not in self.axes]
        cshape = tuple(x.shape[i] for i in kept)
        n = x.size // max(1, int(numpy.prod(cshape)))
        x64 = x.astype(numpy.float64, copy=False)
        s = x64.sum(axis=self.axes)
        local_mean = s / n if n else xp.zeros_like(s)
        dev = x64 - local_mean.reshape(
            [x.shape[i] if i in kept else 1 for i in range(x.ndim)])
        m2 = (dev * dev).sum(axis=self.axes)
        with self.comm.collective('multi_node_batch_normalization'):
            # Agreeing on the channels and where the statistics are combined
            # also tells apart ranks in training mode from ranks that skipped
            # this collective (evaluation mode): they are in another one.
            self.comm.header((cshape, x.dtype.str, xp is numpy),
                              self._mismatch)
            if xp is numpy:
                mean, var, self.total = self._combine_on_host(n, s, m2)
            else:
                mean, var, self.total = self._combine_on_device(
                    n, s, m2, local_mean)
        self._check_count(x, n)
        return (mean.reshape(cshape).astype(x.dtype),
                var.reshape(cshape).astype(x.dtype))

    @staticmethod
    def _mismatch(values):
        return ValueError(
            'multi_node_batch_normalization: the ranks differ in channels, '
            'dtype or device: {}'.format(by_rank(values, lambda v: (
                'channels {} dtype {} on the {}'.format(
                    v[0], numpy.dtype(v[1]).name, 'host' if v[2] else 'GPU')))))

    def _check_count(self, x, n):
        if self.total == 0:
            raise ValueError('multi_node_batch_normalization: the global '
                             'batch is empty')
        if self.total < 2:  # as F.batch_normalization
            raise ValueError(
                'multi_node_batch_normalization: the global batch has {} '
                'element per channel (x of shape {} on rank {}, reduced axes '
                '{}, {} here); training-mode statistics need at least 2'
                .format(self.total, x.shape, self.comm.rank, self.axes, n))

    def _combine_on_host(self, n, s, m2):
        """Chan's formula over every rank's ``[n, s, M2]`` (one Allgather),
        combined in rank order: the same bits on every rank. Returns the
        global ``(mean, var, count)``."""
        mine = numpy.concatenate([[n], s.ravel(), m2.ravel()])
        rows = numpy.empty((self.comm.size, mine.size), dtype=numpy.float64)
        self.comm.wire.Allgather(mine, rows)
        c = s.size
        counts, sums, m2s = rows[:, 0], rows[:, 1:1 + c], rows[:, 1 + c:]
        total = int(counts.sum())
        mean = sums.sum(axis=0) / max(total, 1)
        means = sums / numpy.maximum(counts, 1)[:, None]
        var = (m2s + counts[:, None] * (means - mean) ** 2).sum(axis=0)
        return mean, var / max(total, 1), total

    def _combine_on_device(self, n, s, m2, local_mean):
        """On the GPU the statistics stay there: one allreduce of the sums
        ``[s, M2 + s * mean_local]`` per channel (``comm.allreduce``, NCCL
        with ``pure_nccl``), so the step never waits for the device. The
        counts come from shapes, so their sum is a host exchange. In float64,
        ``sum(M2 + n mean_r^2) - N mean^2`` loses digits only when the mean
        is some 10^6 standard deviations away from zero. Returns the global
        ``(mean, var, count)``."""
        MPI = mpi.import_mpi()
        xp = backend.get_array_module(s)
        count = numpy.array([n], numpy.int64)
        self.comm.wire.Allreduce(MPI.IN_PLACE, count, op=MPI.SUM)
        total = int(count[0])
        sums = self.comm.allreduce(xp.concatenate(
            [s.ravel(), (m2 + s * local_mean).ravel()]))
        mean = sums[:s.size] / max(total, 1)
        var = xp.maximum(sums[s.size:] / max(total, 1) - mean * mean, 0.0)
        return mean, var, total

    def backward(self, indexes, grad_outputs):
        x, = self.get_retained_inputs()
        mean, = self.get_retained_outputs()
        g_mean, g_var = AllreduceSum(self.comm).apply(tuple(
            g if g is not None else Variable(mean.xp.zeros_like(mean.array))
            for g in grad_outputs))
        bshape = [1 if i in self.axes else s for i, s in enumerate(x.shape)]

        def b(v):
            return broadcast_to(reshape(v, bshape), x.shape)
        inv_n = 1.0 / self.total
        return (b(g_mean * inv_n) + b(g_var * (2.0 * inv_n))
                * (x - b(mean))),


def global_moments(x, comm, axes):
    """Per-channel ``(mean, var)`` (biased) over all ranks' ``x``, reducing
    ``axes``; differentiable. Returns Variables of the channel shape and
    the global element count per channel."""
    node = _GlobalMoments(comm, axes)
    mean, var = node.apply((x,))
    return mean, var, node.total


def multi_node_batch_normalization(x, gamma, beta, comm, eps=2e-5,
                                   running_mean=None, running_var=None,
                                   decay=0.9, axis=None):
    """Batch normalization whose statistics span every rank's batch.

    Same math as ``F.batch_normalization`` applied to the concatenation of
    all ranks' ``x`` (local batch sizes may differ); each rank gets its own
    rows of the output.

    Args:
        x: Variable or array ``(N_local, C, ...)``, floating point.
        gamma, beta: scale and shift of the channel shape, dtype of x.
        comm: a minichain.dist communicator (every rank must call this).
        eps: added to the variance.
        running_mean, running_var: updated IN PLACE with the global
            statistics (the variance unbiased by ``N / (N - 1)``, N the
            global count per channel).
        decay: weight of the old running value.
        axis: reduced axes as in ``F.batch_normalization``.
    Returns:
        Variable shaped like x.
    """
    xa, ga = unwrap(x), unwrap(gamma)
    check_float('multi_node_batch_normalization', xa, 'x')
    axes = _reduced_axes(xa.ndim, ga.ndim, axis)
    mean, var, total = global_moments(x, comm, axes)
    if running_mean is not None:
        running_mean[...] = decay * running_mean + (1 - decay) * mean.array
    if running_var is not None:
        adjust = total / max(total - 1, 1)
        running_var[...] = (decay * running_var
                            + (1 - decay) * adjust * var.array)
    return fixed_batch_normalization(x, gamma, beta, mean, var, eps=eps,
                                     axis=axis)


class MultiNodeBatchNormalization(BatchNormalization):
    """``L.BatchNormalization`` with statistics over every rank's batch.

    Same parameters (``gamma``, ``beta``) and persistents (``avg_mean``,
    ``avg_var``, ``N``) as ``L.BatchNormalization``, so snapshots and
    ``copyparams`` move freely between the two. In training every rank must
    call it (it communicates); in evaluation it uses the running statistics
    and does not communicate.

    Args:
        size: channel count or shape (None: from the first input).
        comm: a minichain.dist communicator.
        decay, eps, dtype, use_gamma, use_beta, initial_gamma,
        initial_beta, axis: as for ``L.BatchNormalization``.
    """

    def __init__(self, size, comm, decay=0.9, eps=2e-5, dtype=numpy.float32,
                 use_gamma=True, use_beta=True, initial_gamma=None,
                 initial_beta=None, axis=None):
        super().__init__(size, decay=decay, eps=eps, dtype=dtype,
                         use_gamma=use_gamma, use_beta=use_beta,
                         initial_gamma=initial_gamma,
                         initial_beta=initial_beta, axis=axis)
        self.comm = comm

    def forward(self, x, finetune=False, residual=None, relu=False):
        """Normalize ``x`` (see ``L.BatchNormalization.forward``; here
        ``residual`` and ``relu`` are separate ops)."""
        if not config.train:
            return super().forward(x, residual=residual, relu=relu)
        self.initialize_for(x)
        xp = self.xp
        gamma = self.gamma if self.gamma is not None else xp.ones(
            self.avg_mean.shape, dtype=self.avg_mean.dtype)
        beta = self.beta if self.beta is not None else xp.zeros(
            self.avg_mean.shape, dtype=self.avg_mean.dtype)
        with running_statistics_guard(self):  # the same on every rank
            if finetune:
                self.N += 1
                decay = 1.0 - 1.0 / self.N
            else:
                decay = self.decay
            y = multi_node_batch_normalization(
                x, gamma, beta, self.comm, eps=self.eps,
                running_mean=self.avg_mean, running_var=self.avg_var,
                decay=decay, axis=self.axis)
        return then_add_relu(y, residual, relu)

    def __deepcopy__(self, memo):
        # The communicator (MPI handles) is shared, never copied.
        new = object.__new__(type(self))
        memo[id(self)] = new
        for k, v in self.__dict__.items():
            new.__dict__[k] = v if k == 'comm' else copy.deepcopy(v, memo)
        return new


def create_mnbn_model(link, comm):
    """A deep copy of ``link`` in which every ``L.BatchNormalization`` is a
    :class:`MultiNodeBatchNormalization` over ``comm``.

    Parameters, persistents and hyper-parameters carry over unchanged
    (subclasses of ``L.BatchNormalization`` are left alone).
    """
    result = copy.deepcopy(link)
    for _, sub in result.namedlinks():
        if type(sub) is BatchNormalization:
            # Re-classing keeps the object (and so every container that
            # holds it: Chain attribute, ChainList slot, Sequential layer);
            # the subclass adds nothing but ``comm``.
            sub.__class__ = MultiNodeBatchNormalization
            sub.__dict__['comm'] = comm
    return result
