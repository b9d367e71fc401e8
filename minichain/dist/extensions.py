"""Trainer extensions for data-parallel training (ChainerMN's
``chainermn.extensions``): evaluation and snapshots here.

* :func:`create_multi_node_evaluator` makes an ``Evaluator`` report the
  metrics of the whole validation set, although each rank only evaluates its
  own shard (ChainerMN's fourth porting call).
* :func:`multi_node_snapshot` writes the trainer from one rank and resumes
  every rank from that one file; it records the number of processes and
  refuses a snapshot written by a different one (its docstring has an
  example).

The rest of ``chainermn.extensions`` is imported from its own modules.
"""
import contextlib
import io
import json
import types
import zipfile
import zlib

import numpy

from minichain import backend
from minichain.dist.checkpoint import create_multi_node_checkpointer  # noqa
from minichain.dist.evaluation import GenericMultiNodeEvaluator  # noqa: F401
from minichain.dist.observation import (  # noqa: F401
    AllreducePersistent, MultiNodeEarlyStoppingTrigger, ObservationAggregator)
from minichain.reporter import DictSummary
from minichain.serializers import (Deserializer, DictionarySerializer,
                                   NpzDeserializer)
from minichain.training import extension

__all__ = ['AllreducePersistent', 'GenericMultiNodeEvaluator',
           'MultiNodeEarlyStoppingTrigger', 'MultiNodeSnapshot',
           'ObservationAggregator', 'create_multi_node_checkpointer',
           'create_multi_node_evaluator', 'multi_node_snapshot']


# -- evaluation ---------------------------------------------------------------
def _summary_sums(summary):
    """``{key: (sum of weight * value, sum of weight)}`` of a DictSummary,
    read through its snapshot format (its only public view of the sums)."""
    s = DictionarySerializer()
    summary.serialize(s)
    names = json.loads(s.target['_names'].item())
    return {name: (float(s.target['_summaries/{}/_x'.format(i)]),
                   float(s.target['_summaries/{}/_n'.format(i)]))
            for i, name in enumerate(names)}


def _local_summary(evaluator):
    iterator = evaluator.get_iterator('main')
    if len(getattr(iterator, 'dataset', (None,))) == 0:
        return DictSummary()  # an empty shard contributes nothing
    return evaluator.evaluate_summary()


def combine_summaries(comm, summary):
    """Per-example means over every rank's examples.

    .. math:: \\mathrm{mean}_k = \\frac{\\sum_r \\sum_{b \\in r} n_b v_{k,b}}
              {\\sum_r \\sum_{b \\in r} n_b}

    where ``v_{k,b}`` is metric ``k`` on batch ``b`` of ``n_b`` examples:
    the same number one process gets over the whole set, whatever the shard
    lengths (sums are combined in float64).

    Args:
        comm: a minichain.dist communicator (collective: every rank calls).
        summary: this rank's ``DictSummary`` of batch means weighted by
            batch sizes (``Evaluator.evaluate_summary()``); may be empty.
    Returns:
        ``{key: float}``, the same on every rank; a key that no rank
        observed is absent.
    """
    sums = _summary_sums(summary)
    names = sorted(set().union(*comm.allgather_obj(sorted(sums))))
    buf = numpy.array([v for k in names for v in sums.get(k, (0.0, 0.0))],
                      dtype=numpy.float64)
    if buf.size:
        buf = comm.allreduce(buf, 'sum')
    return {k: buf[2 * i] / buf[2 * i + 1] for i, k in enumerate(names)
            if buf[2 * i + 1] > 0}


def create_multi_node_evaluator(actual_evaluator, communicator):
    """Make an Evaluator report metrics over all ranks' shards.

    Each rank evaluates only its own shard (e.g. from
    ``scatter_dataset(test, comm, force_equal_length=False)``, which covers
    the set exactly once); the weighted sums of every rank are then added
    up, so the reported means equal one process evaluating the whole set,
    also when the shards differ in length or one is empty. As in ChainerMN,
    the evaluator itself is returned with its ``evaluate`` replaced, so it
    keeps its name, trigger and priority.

    Every rank must call it at the same points (it is a collective): extend
    the trainer of every rank with it, not only rank 0's.

    Args:
        actual_evaluator: an ``extensions.Evaluator`` (or a subclass with
            ``evaluate_summary()``).
        communicator: a minichain.dist communicator.
    Returns:
        ``actual_evaluator``, now multi-node.
    """
    if not hasattr(actual_evaluator, 'evaluate_summary'):
        raise TypeError('create_multi_node_evaluator: expected an Evaluator '
                        'with evaluate_summary(), got {}'.format(
                            type(actual_evaluator).__name__))

    def evaluate(self):
        return combine_summaries(communicator, _local_summary(self))

    actual_evaluator.evaluate = types.MethodType(evaluate, actual_evaluator)
    actual_evaluator.communicator = communicator
    return actual_evaluator


# -- snapshots ----------------------------------------------------------------
class MultiNodeSnapshot(extension.Extension):
    """A snapshot extension run on every rank, written by ``root`` only.

    Data-parallel ranks hold the same parameters and optimizer state; with
    equal shard lengths and the same iterator seed on every rank, their
    iterators agree too, so one file describes the whole job. The number of
    processes is stored in the snapshot (as this extension's own state,
    ``extensions/<name>/world_size``): the shards, the iterators' state and
    the global batch all depend on it, so :meth:`load` refuses a snapshot
    written with another number.

    Persistent values of the trained links may differ between ranks
    (per-rank batch-norm running statistics): every rank sends its own to
    ``root`` when a snapshot is taken, they are stored per rank
    (``extensions/<name>/rank<r>/...``), and :meth:`load` gives each rank its
    own back. Other per-rank state (e.g. a different shuffling seed per rank)
    is not kept: every rank resumes with ``root``'s.

    Use :func:`multi_node_snapshot` to make one.

    Attributes:
        comm: the communicator.
        snapshot: the wrapped snapshot extension (called on ``root``).
        root: the writing rank.
        last_iteration: iteration of the last snapshot written (None before).
    """

    default_name = 'multi_node_snapshot'

    def __init__(self, comm, snapshot, root=0):
        self.comm = comm
        self.snapshot = snapshot
        self.root = root
        self.trigger = getattr(snapshot, 'trigger', (1, 'epoch'))
        self.priority = getattr(snapshot, 'priority',
                                extension.PRIORITY_SNAPSHOT)
        self.last_iteration = None
        self._per_rank = None   # gathered persistents while saving (root)
        self._loading = None    # the trainer being loaded by load()

    def __call__(self, trainer):
        """Write the snapshot on ``root`` (collective: the other ranks send
        their persistent values, e.g. per-rank batch-norm statistics).

        Raises:
            OSError: on every rank, when ``root`` could not write the file
                (a full disk, say); the previous snapshots are untouched.
        """
        self._per_rank = self.comm.gather_obj(_persistents(trainer),
                                              self.root)
        failed = None
        try:
            with _whole_optimizer_states(trainer):
                if self.comm.rank == self.root:
                    try:
                        self.snapshot(trainer)
                    except OSError as e:
                        failed = str(e)
        finally:
            self._per_rank = None
        failed = self.comm.bcast_obj(failed, self.root)
        if failed is not None:
            error = OSError('multi_node_snapshot: rank {} could not write the '
                            'snapshot of iteration {}: {}'.format(
                                self.root, trainer.updater.iteration, failed))
            error.raised_on_every_rank = True
            raise error
        self.last_iteration = trainer.updater.iteration

    def initialize(self, trainer):
        """Initialize the wrapped snapshot (if it needs to)."""
        if self.comm.rank == self.root and hasattr(self.snapshot,
                                                   'initialize'):
            self.snapshot.initialize(trainer)

    def finalize(self):
        """Finalize the wrapped snapshot (if it needs to)."""
        if self.comm.rank == self.root and hasattr(self.snapshot,
                                                   'finalize'):
            self.snapshot.finalize()

    def serialize(self, serializer):
        """Save the world size and the other ranks' persistent values; on
        loading through :meth:`load`, refuse another world size and give
        each rank its own persistent values back."""
        stored = serializer('world_size', int(self.comm.size))
        if int(stored) != self.comm.size:
            raise ValueError(_size_message('the snapshot', int(stored),
                                           self.comm.size))
        if not isinstance(serializer, Deserializer):
            for rank, values in enumerate(self._per_rank or ()):
                if rank != self.root:
                    for key, value in values.items():
                        serializer['rank{}'.format(rank)](key, value)
        elif self._loading is not None and self.comm.rank != self.root:
            _restore_persistents(self._loading, serializer['rank{}'.format(
                self.comm.rank)])

    def _key(self):
        if self.name is None:
            raise RuntimeError('MultiNodeSnapshot.load: call trainer.extend('
                               'snapshot) before load(), so that it knows its '
                               'name in the trainer')
        return 'extensions/{}/world_size'.format(self.name)

    def _read_on_root(self, path):
        """``(bytes, None)`` or ``(None, error message)`` (root only)."""
        try:
            with open(path, 'rb') as f:
                data = f.read()
            check_archive(data, path)
            with numpy.load(io.BytesIO(data), allow_pickle=False) as npz:
                key = self._key()
                if key not in npz:
                    return None, ('{} has no world size ({!r}); it was not '
                                  'written by multi_node_snapshot under the '
                                  'name {!r}'.format(path, key, self.name))
                stored = int(npz[key])
        except Exception as e:  # noqa: BLE001 - reported on every rank
            return None, 'cannot read snapshot {}: {}: {}'.format(
                path, type(e).__name__, e)
        if stored != self.comm.size:
            return None, _size_message(path, stored, self.comm.size)
        return data, None

    def load(self, path, trainer):
        """Resume ``trainer`` on every rank from ``root``'s file ``path``.

        Collective: every rank calls it after ``trainer.extend(self)`` and
        before ``trainer.run()``. ``root`` reads the file and sends its bytes
        to the others (no shared file system needed), so every rank resumes
        from the same iteration. Keys of extensions that only ``root`` has
        (LogReport, PlotReport...) are ignored on the other ranks. A
        multi-node optimizer that already broadcast its parameters in the
        saved run does not broadcast again (which would skip a step).

        Raises:
            ValueError: on every rank: the file is missing or unreadable, was
                written with another number of processes, or does not fit
                the trainer (the message names the key).
        """
        comm = self.comm
        self._key()  # extended? (checked on every rank alike)
        data, error = (self._read_on_root(path) if comm.rank == self.root
                       else (None, None))
        error = comm.bcast_obj(error, self.root)
        if error is not None:
            raise ValueError('multi_node_snapshot: ' + error)
        data = comm.bcast_obj(data, self.root)
        error = None
        try:
            self._loading = trainer
            with numpy.load(io.BytesIO(data), allow_pickle=False) as npz:
                s = NpzDeserializer(npz, strict=True, file_name=str(path))
                s.load(trainer)
                others = 'extensions/{}/rank'.format(self.name)
                unused = [k for k in s.unused_keys() if not k.startswith(
                    others)] if comm.rank == self.root else []
            if unused:
                error = '{} has keys the trainer did not read: {}'.format(
                    path, ', '.join(unused[:5]))
        except (KeyError, ValueError, TypeError) as e:
            error = 'cannot resume from {}: {}'.format(
                path, e.args[0] if e.args else e)
        finally:
            self._loading = None
        errors = comm.allgather_obj(error)
        failed = [(r, e) for r, e in enumerate(errors) if e is not None]
        if failed:
            rank, error = failed[0]
            raise ValueError('multi_node_snapshot: rank {}: {}'.format(
                rank, error))
        self.last_iteration = trainer.updater.iteration
        if trainer.updater.iteration > 0:
            for opt in trainer.updater.get_all_optimizers().values():
                if getattr(opt, 'needs_broadcast', False):
                    opt.needs_broadcast = False


@contextlib.contextmanager
def _whole_optimizer_states(trainer):
    """Every multi-node optimizer's state whole on every rank (a sharded
    one, ``shard_state=True``, gathers its shards: collective), so that
    ``root`` writes it as without sharding."""
    with contextlib.ExitStack() as stack:
        for opt in trainer.updater.get_all_optimizers().values():
            gathered = getattr(opt, 'gathered_state', None)
            if gathered is not None:
                stack.enter_context(gathered())
        yield


def check_archive(data, path):
    """Raise ValueError unless ``data`` is a whole zip archive whose members
    all pass their CRC check (a snapshot with a flipped byte or cut short
    fails here, before anything is loaded, rather than halfway)."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, zlib.error, OSError, EOFError,
            ValueError) as e:
        raise ValueError('{} is not a whole npz archive ({})'.format(
            path, e)) from None
    if bad is not None:
        raise ValueError('{} is damaged: member {} fails its CRC check'
                         .format(path, bad))


def _targets(trainer):
    return sorted((name, opt.target) for name, opt in
                  trainer.updater.get_all_optimizers().items())


def _persistents(trainer):
    """``{'<optimizer name><path>': host value}`` of the trained links."""
    return {name + path: (backend.to_cpu(value) if backend.is_array(value)
                          else value)
            for name, target in _targets(trainer)
            for path, value in target.namedpersistents()}


def _restore_persistents(trainer, serializer):
    """Load this rank's persistent values (arrays in place, scalars set on
    their link), as ``bcast_data`` sets them."""
    for name, target in _targets(trainer):
        links = dict(target.namedlinks())
        for path, value in target.namedpersistents():
            value = serializer(name + path, value)
            owner, attr = path.rsplit('/', 1)
            setattr(links[owner or '/'], attr, value)


def _size_message(what, stored, size):
    return ('{} was written by a run with {} process{}, but this run has {}; '
            'resume it with the same number of processes (mpiexec -n {}): the '
            'shards, the iterator state and the global batch depend on it'
            .format(what, stored, '' if stored == 1 else 'es', size, stored))


def multi_node_snapshot(comm, snapshot=None, root=0, replica_sets=None):
    """Wrap a snapshot extension for a data-parallel trainer (with
    ``replica_sets``, or a list in place of ``root`` as in ChainerMN 7, see
    :mod:`minichain.dist.replica_snapshot` instead).

    Extend the trainer of **every** rank with the result (it is collective
    when loading, and records the world size); only ``root`` writes.

    Example::

        snap = dist.multi_node_snapshot(
            comm, extensions.snapshot(filename='snapshot_iter_{.updater.'
                                      'iteration}'))
        trainer.extend(snap, trigger=(1, 'epoch'))
        if args.resume:
            snap.load(args.resume, trainer)

    Args:
        comm: a minichain.dist communicator.
        snapshot: the extension that writes the trainer on ``root``
            (default ``extensions.snapshot()``); its trigger and priority
            become the wrapper's defaults.
        root: the rank that writes and reads.
    Returns:
        A :class:`MultiNodeSnapshot`.
    """
    if snapshot is None:
        from minichain.training.extensions import snapshot as make_snapshot
        snapshot = make_snapshot()
    if replica_sets is not None or not isinstance(root, int):
        from minichain.dist.replica_snapshot import ReplicaSetsSnapshot
        return ReplicaSetsSnapshot(comm, snapshot, root if replica_sets is
                                   None else replica_sets)
    if not 0 <= root < comm.size:
        raise ValueError('multi_node_snapshot: root must be a rank in '
                         '[0, {}), got {}'.format(comm.size, root))
    if getattr(snapshot, 'autoload', False):
        # It would load on root alone; load() resumes every rank together.
        raise ValueError('multi_node_snapshot: the wrapped snapshot has '
                         'autoload=True, which would resume rank {} only; '
                         'call load(path, trainer) on every rank instead'
                         .format(root))
    return MultiNodeSnapshot(comm, snapshot, root)
