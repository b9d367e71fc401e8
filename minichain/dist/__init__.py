"""minichain.dist: synchronous data-parallel training over MPI and NCCL.

Import it explicitly (``from minichain import dist``); importing is cheap and
needs neither mpi4py nor CuPy: MPI starts when the first communicator is
created, CuPy/NCCL when the first GPU gradient is averaged.

Typical use, under ``mpiexec -n 4 python train.py``::

    from minichain import dist
    comm = dist.create_communicator('flat')
    train = dist.scatter_dataset(train, comm, shuffle=True, seed=0)
    model = dist.create_mnbn_model(model, comm)        # synchronized BN
    opt = dist.create_multi_node_optimizer(MomentumSGD(lr=0.1), comm)
    opt.setup(model)

The protocol (the communicators, the multi-node optimizer, averaging/) is
the lesson. The layers below wrap it from outside, one line each: delete a
layer's folder and its line, and the protocol still trains (docs/dist.md,
"The layers"). With the guards, creating a communicator installs an
abort-on-uncaught-exception hook (:mod:`minichain.dist.guards.safety`) and
every collective is watched: a rank that waits longer than
``MINICHAIN_STALL_TIMEOUT`` seconds (default 600, 0: off), or that can tell
sooner that its collective will never complete, ends the job with a report
naming the ranks (:mod:`minichain.dist.guards.watchdog`).
"""
import importlib
import sys

from minichain.dist import hooks

# The layers, outermost first (each appends its class to hooks.layers).
from minichain.dist import trace  # layer: trace
from minichain.dist import guards  # layer: guards
from minichain.dist import transports  # layer: transports
from minichain.dist import testing  # layer: testing

_COMMUNICATORS = {
    'naive': ('minichain.dist.naive', 'NaiveCommunicator'),
    'flat': ('minichain.dist.flat', 'FlatCommunicator'),
    'ring': ('minichain.dist.ring', 'RingCommunicator'),
    'pure_nccl': ('minichain.dist.pure_nccl', 'PureNcclCommunicator'),
    'hierarchical': ('minichain.dist.hierarchical',
                     'HierarchicalCommunicator'),
    # ChainerMN's name of NCCL inside nodes, MPI between them (via the host)
    'non_cuda_aware': ('minichain.dist.hierarchical',
                       'HierarchicalCommunicator'),
}

# Public names loaded on first access (PEP 562), so that importing
# minichain.dist stays light and never touches mpi4py or CuPy.
_LAZY = {
    'CommunicatorBase': 'minichain.dist.communicator_base',
    'NonFiniteGradientError': 'minichain.dist.optimizers',
    'create_multi_node_optimizer': 'minichain.dist.optimizers',
    'join': 'minichain.dist.averaging.join',
    'scatter_dataset': 'minichain.dist.datasets',
    'scatter_index': 'minichain.dist.datasets',
    'MultiNodeBatchNormalization': 'minichain.dist.batch_normalization',
    'MultiNodeChainList': 'minichain.dist.multi_node_chain_list',
    'multi_node_batch_normalization': 'minichain.dist.batch_normalization',
    'create_mnbn_model': 'minichain.dist.batch_normalization',
    'evaluate': 'minichain.dist.evaluation',
    'weighted_mean': 'minichain.dist.evaluation',
    'create_multi_node_evaluator': 'minichain.dist.extensions',
    'create_multi_node_checkpointer': 'minichain.dist.checkpoint',
    'multi_node_snapshot': 'minichain.dist.extensions',
}

__all__ = ['create_communicator'] + sorted(_LAZY) + sorted(hooks.names)


def _why_not_nccl():
    """'' when a GPU and NCCL are usable, else the reason (names what to
    install)."""
    from minichain import backend
    if backend.cupy is None:
        return 'CuPy is not installed'
    if not backend.gpu_available():
        return backend.gpu_problem()[1]
    try:
        from minichain.dist.nccl import nccl_module
        nccl_module()
    except RuntimeError as e:
        return str(e)
    return ''


def _why_not_nccl_anywhere(mpi_comm):
    """'' when NCCL can run on every rank, each on a GPU of its own, else
    why not; collective, with the same answer on every rank (they must all
    create the same communicator).

    Each rank names the GPU it would take (:func:`minichain.device.
    rank_device_id`) by its PCI bus: ranks that share a GPU (two ranks on a
    one-GPU machine, more ranks than GPUs on a node) would fail at NCCL's
    first allreduce. Ranks that a launcher bound to one GPU each (each sees
    its own as device 0) have different buses and pass.
    """
    from minichain import device
    from minichain.dist import mpi
    MPI = mpi.import_mpi()
    comm = MPI.COMM_WORLD if mpi_comm is None else mpi_comm
    node = MPI.Get_processor_name()
    nodes = comm.allgather(node)
    why, bus = _why_not_nccl(), None
    if not why:
        same = [r for r, n in enumerate(nodes) if n == node]
        bus = device.gpu_bus_id(device.rank_device_id(
            same.index(comm.rank), len(same), device.visible_gpu_count()))
    return _auto_verdict(comm.allgather((why, node, bus)))


def _auto_verdict(answers):
    """Why not NCCL, from every rank's ``(why not, node, GPU bus)``."""
    from minichain.dist.failures import format_ranks
    whys = {}
    for r, (why, _, _) in enumerate(answers):
        if why:
            whys.setdefault(why, []).append(r)
    if len(whys) == 1 and len(next(iter(whys.values()))) == len(answers):
        return next(iter(whys))  # the same reason everywhere
    if whys:
        return '; '.join('{}: {}'.format(format_ranks(ranks), why)
                         for why, ranks in whys.items())
    users = {}
    for r, (_, node, bus) in enumerate(answers):
        users.setdefault((node, bus), []).append(r)
    shared = [(key, ranks) for key, ranks in users.items() if len(ranks) > 1]
    if not shared:
        return ''
    (node, bus), ranks = shared[0]
    return ('{} would share one GPU (bus {}) on node {}, and NCCL needs a '
            'GPU per rank: run at most as many ranks per node as it has '
            'GPUs'.format(format_ranks(ranks), bus, node))


_auto_told = False


def _tell_auto_fallback(why, mpi_comm):
    """Say once, on rank 0, why 'auto' did not pick NCCL: a GPU job that
    silently fell back to MPI would only look slow."""
    global _auto_told
    if _auto_told:
        return
    _auto_told = True
    from minichain.dist import mpi
    comm = mpi.import_mpi().COMM_WORLD if mpi_comm is None else mpi_comm
    if comm.rank == 0:
        print("minichain.dist: create_communicator('auto') chose 'flat', not "
              "'pure_nccl': {}".format(why), file=sys.stderr, flush=True)


def default_layers():
    """The layers :func:`create_communicator` puts in front of a
    communicator's protocol, outermost first: those installed
    (:data:`minichain.dist.hooks.layers`): the timeline
    (trace/traced.py: ``Traced``), the guards (guards/guarded.py:
    ``Guarded``), the sum in memory that the ranks of one machine share
    and the pipeline of packed host buffers (transports/:
    ``SharedMemory``, ``Pipelined``)."""
    return tuple(hooks.layers)


def _communicator_class(name, layers=None):
    """The class of communicator ``name`` (a key of the table above) with
    ``layers`` in front (None: :func:`default_layers`)."""
    from minichain.dist.communicator_base import with_layers
    module, cls = _COMMUNICATORS[name]
    return with_layers(getattr(importlib.import_module(module), cls),
                       default_layers() if layers is None else tuple(layers))


def create_communicator(communicator_name='auto', mpi_comm=None,
                        allreduce_grad_dtype=None, overlap=False,
                        bucket_mb=None, layers=None):
    """Create a communicator for data-parallel training.

    Args:
        communicator_name: ``'naive'`` (one MPI Allreduce per parameter),
            ``'flat'`` (one packed MPI Allreduce), ``'ring'`` (flat's
            packed buffer summed by a ring allreduce written in Python,
            to be read: :mod:`minichain.dist.ring`), ``'pure_nccl'`` (NCCL on
            the GPUs), ``'hierarchical'`` (NCCL in a node, MPI between
            nodes; also ChainerMN's ``'non_cuda_aware'``), or ``'auto'``:
            ``'pure_nccl'`` when every rank can use NCCL on a GPU of its
            own, else ``'flat'`` (rank 0 then says why, once, on stderr);
            collective.
        mpi_comm: an ``mpi4py.MPI.Comm`` (default ``MPI.COMM_WORLD``).
        allreduce_grad_dtype: dtype of the gradient transfer (float32 or
            float64; float16 and ``'bfloat16'`` only with NCCL), default the
            gradients' own.
        overlap, bucket_mb: the defaults of the multi-node optimizers made
            with this communicator: average gradients in buckets of about
            ``bucket_mb`` MiB while backward runs (see
            :func:`create_multi_node_optimizer`); not with ``'naive'``.
        layers: the layer classes put in front of the communicator's
            protocol (None: :func:`default_layers`; ``()``: the bare
            protocol, without the guards and the timeline, for tests and
            teaching: see docs/dist.md, "The layers").
    Returns:
        A :class:`~minichain.dist.communicator_base.CommunicatorBase`.
    Raises:
        ValueError: unknown name (the message lists the valid ones).
        ImportError: mpi4py or the MPI library is missing (says how to
            install them).
    """
    name = communicator_name
    if name == 'auto':
        why = _why_not_nccl_anywhere(mpi_comm)
        name = 'flat' if why else 'pure_nccl'
        if why:
            _tell_auto_fallback(why, mpi_comm)
    if name not in _COMMUNICATORS:
        raise ValueError('create_communicator: unknown communicator {!r}; '
                         'valid names: {}'.format(
                             communicator_name,
                             ', '.join(['auto'] + sorted(_COMMUNICATORS))))
    cls = _communicator_class(name, layers)
    if overlap and not cls.can_overlap:
        raise ValueError('create_communicator: the {} communicator cannot '
                         'overlap (use flat, pure_nccl or hierarchical)'
                         .format(name))
    comm = cls(mpi_comm, allreduce_grad_dtype=allreduce_grad_dtype)
    comm.overlap, comm.bucket_mb = bool(overlap), bucket_mb
    return comm


# ChainerMN's module paths: chainermn.links, chainermn.functions...
_SUBMODULES = ('communicators', 'datasets', 'extensions', 'functions',
               'iterators', 'links', 'nccl', 'optimizers', 'testing')


def __getattr__(name):
    if name in _SUBMODULES:
        return importlib.import_module('minichain.dist.' + name)
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name in hooks.names:  # added by a layer
        return hooks.names[name]
    raise AttributeError('module minichain.dist has no attribute {!r}'
                         .format(name))


def __dir__():
    return sorted(set(globals()) | set(_LAZY) | set(_SUBMODULES)
                  | set(hooks.names))
