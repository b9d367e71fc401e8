"""Multi-node evaluation: metrics over all ranks' shards, weighted by samples.

Averaging each rank's mean accuracy is wrong when the shards differ in size
(``scatter_dataset(..., force_equal_length=False)`` gives lengths that differ
by one). These helpers weight every mean by its number of samples, so the
result equals one process evaluating the whole set.
:class:`GenericMultiNodeEvaluator` (ChainerMN's) gathers results that are not
means to one rank instead.
"""
import numpy

from minichain import backend
from minichain.configuration import no_backprop_mode, using_config
from minichain.dataset.convert import concat_examples
from minichain.training import extension


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


class GenericMultiNodeEvaluator(extension.Extension):
    """Evaluation whose results are not means (ChainerMN's): each rank runs
    :meth:`calc_local` on each of its batches, and ``root`` passes every
    rank's results to :meth:`aggregate`, once. Override both (by default
    the results are the target's outputs, and ``aggregate`` returns their
    list); report from ``aggregate``.

    Args:
        comm: a :mod:`minichain.dist` communicator.
        iterator: this rank's iterator over its shard (not repeating; the
            shards may differ in length).
        target: the model (``calc_local`` calls it with each batch).
        device: where the converter puts the batches.
        converter: batch -> arrays (default ``concat_examples``).
        root: the rank that aggregates.
        progress_hook: called with each of ``root``'s batches.
    """

    trigger = 1, 'epoch'
    default_name = 'validation'
    priority = extension.PRIORITY_WRITER

    def __init__(self, comm, iterator, target, device=None,
                 converter=concat_examples, root=0, *, progress_hook=None):
        if not 0 <= root < comm.size:
            raise ValueError('GenericMultiNodeEvaluator: root {} is not a '
                             'rank of {}'.format(root, comm.size))
        self.comm, self.iterator, self.root = comm, iterator, root
        self._targets = {'main': target}
        self.device, self.converter = device, converter
        self._progress_hook = progress_hook

    def __call__(self, trainer=None):
        """Evaluate (collective); ``aggregate``'s result on ``root``, None
        elsewhere."""
        if hasattr(self.iterator, 'reset'):
            self.iterator.reset()
        local = self._local(iter(self.iterator))
        results, done = [], False
        while not done:  # one batch of every rank at a time
            gathered = self.comm.gather_obj(next(local, None), self.root)
            if self.comm.rank == self.root:
                results += [r for r in gathered if r is not None]
            done = self.comm.bcast_obj(gathered is not None and all(
                r is None for r in gathered), self.root)
        return self.aggregate(results) if self.comm.rank == self.root \
            else None

    def _local(self, iterator):
        for batch in iterator:
            arrays = self.converter(batch, self.device)
            with using_config('train', False), no_backprop_mode():
                if isinstance(arrays, tuple):
                    result = self.calc_local(*arrays)
                elif isinstance(arrays, dict):
                    result = self.calc_local(**arrays)
                else:
                    result = self.calc_local(arrays)
            if self._progress_hook and self.comm.rank == self.root:
                self._progress_hook(batch)
            yield result

    def calc_local(self, *args, **kwargs):
        """This rank's result on one batch (not None); the target's output
        by default."""
        return self._targets['main'](*args, **kwargs)

    def aggregate(self, results):
        """Every rank's results, on ``root`` only: returns them."""
        return results
