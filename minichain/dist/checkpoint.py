"""ChainerMN's ``create_multi_node_checkpointer``: every rank writes its own
checkpoints, and a restarted job resumes from the newest iteration that every
rank still has.

Deprecated in ChainerMN 7 (as here) in favour of ``multi_node_snapshot``;
kept for the programs that use it::

    checkpointer = dist.create_multi_node_checkpointer('run1', comm)
    trainer.extend(checkpointer, trigger=(25, 'iteration'))
    checkpointer.maybe_load(trainer, optimizer)   # on every rank
    trainer.run()
"""
import contextlib
import os
import sys
import time
import warnings

from minichain.serializers import load_npz, save_npz
from minichain.training import extension


class MultiNodeCheckpointer(extension.Extension):
    """Checkpoints ``<name>.<rank>.<iteration>`` of each rank's trainer
    (see :func:`create_multi_node_checkpointer`)."""

    def __init__(self, name, comm, cp_interval=5, gc_interval=5, path=None):
        if not name or cp_interval < 1 or gc_interval < 1:
            raise ValueError('create_multi_node_checkpointer: a name and '
                             'intervals of 1 or more, got {!r}, {!r}, {!r}'
                             .format(name, cp_interval, gc_interval))
        self.name, self.comm, self.path = name, comm, path
        self.cp_interval, self.gc_interval = cp_interval, gc_interval
        self.files = []          # this rank's checkpoints, oldest first
        self._durations = []

    def __call__(self, trainer):
        if self.path is None:
            self.path = trainer.out
        self.save(trainer, trainer.updater.iteration)

    def save(self, target, iteration):
        """Write ``target`` as this rank's checkpoint of ``iteration``; now
        and then (every ``gc_interval`` files beyond ``cp_interval``) keep
        only the newest ``cp_interval`` iterations that every rank has.
        Every rank calls it at the same iterations."""
        os.makedirs(self.path, exist_ok=True)
        start = time.monotonic()
        save_npz(os.path.join(self.path, self._filename(iteration)), target)
        self._durations.append(time.monotonic() - start)
        self.files.append(self._filename(iteration))
        if len(self.files) - self.cp_interval >= self.gc_interval:
            self._keep_common(remove_others=True)

    def maybe_load(self, trainer, optimizer=None, path=None):
        """Load the newest iteration that every rank has a checkpoint of,
        if any (collective). With ``optimizer`` (a multi-node one), its
        first update then steps instead of broadcasting: every rank has
        its own state back."""
        if self.path is None:
            self.path = path or trainer.out
        try:
            names = os.listdir(self.path)
        except OSError:
            names = []
        self.files = [n for n in names if self._iteration(n) is not None]
        self.files.sort(key=self._iteration)
        iterations = self._keep_common()
        if iterations:
            load_npz(os.path.join(self.path, self._filename(iterations[-1])),
                     trainer)
            if optimizer is not None:
                optimizer.needs_broadcast = False

    def finalize(self):
        """Remove this rank's checkpoints, unless an exception is on its way
        out of the trainer (``Trainer.run`` calls this in its ``finally``):
        then they are what the rerun resumes from."""
        if sys.exc_info()[0] is not None:
            return
        for name in self.files:
            with contextlib.suppress(OSError):
                os.remove(os.path.join(self.path, name))
        self.files = []

    def get_stats(self):
        """How long saving took on this rank, as a line of text."""
        d = self._durations or [0.0]
        return 'Snapshot duration stats (sec): avg={:f}, min={:f}, max={:f}' \
            .format(sum(d) / len(d), min(d), max(d))

    def _filename(self, iteration):
        return '{}.{}.{}'.format(self.name, self.comm.rank, iteration)

    def _iteration(self, filename):
        name, _, rest = filename.rpartition('.')
        return int(rest) if rest.isdigit() and name == '{}.{}'.format(
            self.name, self.comm.rank) else None

    def _keep_common(self, remove_others=False):
        """Keep the newest ``cp_interval`` iterations that every rank has a
        checkpoint of (collective); returns them, oldest first."""
        mine = {self._iteration(n) for n in self.files}
        common = set.intersection(*self.comm.allgather_obj(mine))
        kept = sorted(common)[-self.cp_interval:]
        if remove_others:
            for i in mine - set(kept):
                with contextlib.suppress(OSError):
                    os.remove(os.path.join(self.path, self._filename(i)))
        self.files = [self._filename(i) for i in kept]
        return kept


def create_multi_node_checkpointer(name, comm, cp_interval=5, gc_interval=5,
                                   path=None):
    """A trainer extension that writes a checkpoint of each rank's trainer.

    Each rank writes ``<name>.<rank>.<iteration>`` (in ``path``, default
    the trainer's ``out``) and keeps at least the newest ``cp_interval``
    iterations that every rank has; ``maybe_load(trainer, optimizer)``
    resumes from the newest of them, and a normal end of training
    removes them (``finalize``). Deprecated, as in ChainerMN: use
    :func:`minichain.dist.multi_node_snapshot`.

    Args:
        name: the run's name, in the file names.
        comm: a :mod:`minichain.dist` communicator.
        cp_interval: how many iterations to keep.
        gc_interval: how many more files before older ones are removed.
        path: the folder (default ``trainer.out``).
    """
    warnings.warn('create_multi_node_checkpointer is deprecated (as in '
                  'ChainerMN): use minichain.dist.multi_node_snapshot',
                  DeprecationWarning, stacklevel=2)
    return MultiNodeCheckpointer(name, comm, cp_interval, gc_interval, path)
