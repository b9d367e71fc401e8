"""Sharding a dataset over the ranks: scatter_index and scatter_dataset
(ChainerMN's ``chainermn.datasets``, with ``create_empty_dataset``)."""
import numpy

from minichain import backend
from minichain.dist import mpi
from minichain.dist.failures import Failure, attempt


def shard_bounds(n, size, force_equal_length):
    """``[(start, stop)]`` positions of each rank's shard in an order of n.

    With ``force_equal_length`` (the default of :func:`scatter_dataset` and
    :func:`scatter_index`) every shard has ``ceil(n / size)`` positions and
    positions past ``n`` wrap to the start: a few examples appear twice, so
    that every rank takes the same number of steps, which synchronous
    data-parallel training needs (a rank that runs out of batches early
    leaves the others waiting in their next allreduce; the watchdog then
    ends the job). Without it the shards are disjoint, cover ``range(n)``
    once, and their lengths differ by at most one (the first ``n % size``
    ranks get one more): right for evaluation
    (``create_multi_node_evaluator`` weights by shard length), and for
    training inside :func:`minichain.dist.join`.
    """
    if force_equal_length:
        length = -(-n // size)
        return [(r * length, (r + 1) * length) for r in range(size)]
    base, extra = divmod(n, size)
    bounds, start = [], 0
    for r in range(size):
        stop = start + base + (1 if r < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def _all_shards(n, size, shuffle, seed, force_equal_length):
    if n < 0:
        raise ValueError('scatter_index: the number of examples must be 0 or '
                         'more, got n={}'.format(n))
    if n == 0:  # as ChainerMN: every rank an empty shard
        return [numpy.arange(0)] * size
    order = (numpy.random.default_rng(seed).permutation(n) if shuffle
             else numpy.arange(n))
    return [order[numpy.arange(a, b) % n]
            for a, b in shard_bounds(n, size, force_equal_length)]


def create_empty_dataset(dataset):
    """A dataset of ``len(dataset)`` empty examples ``()``: for a rank whose
    model takes no input (it receives its input from another rank, as in a
    :class:`~minichain.dist.MultiNodeChainList`), so that its iterator
    yields as many batches as the rank that reads the data. A batch of them
    converts to ``()``, so the model is called with no arguments."""
    return [()] * len(dataset)


def scatter_index(n, comm, root=0, shuffle=False, seed=None,
                  force_equal_length=True):
    """This rank's indices into a dataset of ``n`` examples.

    ``root`` decides the order (a permutation from ``seed`` when
    ``shuffle``, the same for the same seed on every run; a fresh one for
    ``seed=None``) and sends each rank its shard, so the shards always fit
    together even when the ranks' random states differ.

    Args:
        n: dataset length (read on ``root`` only).
        comm: a minichain.dist communicator.
        root: the rank that decides.
        shuffle, seed: shuffle the order first, with this seed.
        force_equal_length: see :func:`shard_bounds`.
    Returns:
        int64 array of this rank's indices.
    """
    with comm.collective('scatter_index'):
        shards = _root_shards(comm, root, n, shuffle, seed,
                              force_equal_length)
        if comm.rank == root:
            for r, shard in enumerate(shards):
                if r != root:
                    comm.send_obj(shard, r, tag=mpi.TAG_SCATTER_INDEX)
            return shards[root]
        return comm.recv_obj(root, tag=mpi.TAG_SCATTER_INDEX)


def _root_shards(comm, root, n, shuffle, seed, force_equal_length):
    """The shards on ``root`` (None elsewhere), after the header: an error
    on ``root`` (no examples) is raised on every rank."""
    if isinstance(n, Failure):  # scatter_dataset's dataset on the root
        shards = n
    else:
        shards = (attempt(_all_shards, n, comm.size, shuffle, seed,
                          force_equal_length) if comm.rank == root else None)
    comm.header(shards if isinstance(shards, Failure) else root)
    return shards


def _take(dataset, idx):
    if backend.is_array(dataset):
        return dataset[idx]
    if _is_columns(dataset):
        return tuple(c[idx] for c in dataset)
    return [dataset[int(i)] for i in idx]


def scatter_dataset(dataset, comm, root=0, shuffle=False, seed=None,
                    force_equal_length=True, *, max_buf_len=None):
    """Give every rank its shard of ``dataset`` (held on ``root`` only).

    ``root`` cuts the dataset as :func:`scatter_index` does and sends each
    rank its examples (pickled, in chunks below MPI's 2 GiB limit); the
    other ranks' ``dataset`` argument is ignored (pass None).

    Args:
        dataset: an array (sharded along axis 0), a tuple of equal-length
            arrays (columns, e.g. ``(x, t)``, sharded together), or any
            sequence of examples.
        comm, root, shuffle, seed, force_equal_length: as for
            :func:`scatter_index`.
        max_buf_len: ChainerMN's message size limit, not needed (the
            examples travel in chunks below MPI's).
    Returns:
        This rank's shard: an array, a tuple of arrays, or a list.
    """
    with comm.collective('scatter_dataset'):
        n = attempt(_length, dataset, root) if comm.rank == root else None
        shards = _root_shards(comm, root, n, shuffle, seed,
                              force_equal_length)
        if comm.rank == root:
            for r, shard in enumerate(shards):
                if r != root:
                    comm.send_obj(_take(dataset, shard), r,
                                  tag=mpi.TAG_SCATTER_DATASET)
            return _take(dataset, shards[root])
        return comm.recv_obj(root, tag=mpi.TAG_SCATTER_DATASET)


def _length(dataset, root):
    if dataset is None or not hasattr(dataset, '__len__'):
        raise TypeError(
            'scatter_dataset: the dataset on rank {} (the root) is {}, not '
            'an array, a tuple of arrays or a sequence; the root holds the '
            'dataset (the other ranks may pass None)'.format(
                root, 'None' if dataset is None else
                'a ' + type(dataset).__name__))
    return len(dataset[0]) if _is_columns(dataset) else len(dataset)


def _is_columns(dataset):
    return (isinstance(dataset, tuple) and len(dataset) > 0
            and all(backend.is_array(c) for c in dataset)
            and len({len(c) for c in dataset}) == 1)
