"""Multi-node evaluation: metrics over all ranks' shards, weighted by samples.

Averaging each rank's mean accuracy is wrong when the shards differ in size
(``scatter_dataset(..., force_equal_length=False)`` gives lengths that differ
by one). These helpers weight every mean by its number of samples, so the
result equals one process evaluating the whole set.
"""
import numpy

from minichain import backend
from minichain.configuration import no_backprop_mode, using_config


def _as_float(v):
    return float(backend.to_cpu(getattr(v, 'array', v)))


def weighted_mean(comm, values, count):
    """Combine per-rank means into global, sample-weighted means.

    Args:
        comm: a minichain.dist communicator.
        values: dict ``name -> mean over this rank's samples`` (floats,
            0-d arrays or Variables); the same names on every rank.
        count: number of samples behind this rank's means (may be 0).
    Returns:
        dict ``name -> sum_r count_r * value_r / sum_r count_r``, the same
        on every rank.
    Raises:
        ValueError: the names differ between ranks, or no rank has samples.
    """
    names = sorted(values)
    all_names = comm.allgather_obj(names)
    if any(n != names for n in all_names):
        raise ValueError('weighted_mean: the metric names differ between '
                         'ranks: {}'.format(all_names))
    buf = numpy.array([float(count)] + [
        float(count) * _as_float(values[k]) if count else 0.0
        for k in names], dtype=numpy.float64)
    buf = comm.allreduce(buf)
    if buf[0] == 0:
        raise ValueError('weighted_mean: no rank has any sample')
    return {k: buf[i + 1] / buf[0] for i, k in enumerate(names)}


def evaluate(comm, metric_fn, dataset, batch_size=100):
    """Evaluate on every rank's shard and return the global means.

    Runs ``metric_fn(dataset[i:i + batch_size])`` over this rank's shard in
    test mode without building a graph; ``metric_fn`` returns a dict of
    means over its batch (e.g. ``{'loss': ..., 'accuracy': ...}``).

    Args:
        comm: a minichain.dist communicator.
        metric_fn: callable on a batch (a slice of ``dataset``).
        dataset: this rank's shard: an array, a tuple of equal-length
            arrays (sliced together) or a sequence; may be empty.
        batch_size: examples per call.
    Returns:
        dict of sample-weighted means over all ranks (same on every rank).
    """
    columns = isinstance(dataset, tuple)
    n = len(dataset[0]) if columns else len(dataset)
    sums, count = {}, 0
    with using_config('train', False), no_backprop_mode():
        for start in range(0, n, batch_size):
            stop = min(n, start + batch_size)
            batch = (tuple(c[start:stop] for c in dataset) if columns
                     else dataset[start:stop])
            for k, v in metric_fn(batch).items():
                sums[k] = sums.get(k, 0.0) + _as_float(v) * (stop - start)
            count += stop - start
    names = comm.allgather_obj(sorted(sums) if count else None)
    names = next((ns for ns in names if ns is not None), [])
    means = {k: (sums[k] / count if count else 0.0) for k in names}
    return weighted_mean(comm, means, count)
