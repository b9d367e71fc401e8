"""ChainerMN's extensions that combine what the ranks observe:
ObservationAggregator, MultiNodeEarlyStoppingTrigger, AllreducePersistent.

Each rank's trainer reports its own values (its shard's loss, its batch
norm's running statistics); these make one value of them for every rank,
so that every rank decides the same thing (to stop, to save).
"""
import operator
import warnings

from minichain import backend
from minichain.reporter import DictSummary
from minichain.training import extension
from minichain.training.triggers import get_trigger
from minichain.variable import Variable


def _mean_of_all(histories):
    """The mean of every rank's values; None when no rank has one yet."""
    values = [v for history in histories for v in history]
    return sum(values) / len(values) if values else None


class ObservationAggregator(extension.Extension):
    """Put the mean over every rank of ``original_key``'s values into the
    observation, as ``aggregated_key``.

    Each iteration, the value this rank observed under ``original_key`` (a
    Variable's on the host) is kept; when ``comm_trigger`` fires, rank 0
    gathers every rank's kept values, reduces them with ``aggregator``
    (default: the mean of all of them) and every rank gets the result in
    ``trainer.observation[aggregated_key]`` (collective: every rank must
    extend its trainer with it).

    Args:
        comm: a :mod:`minichain.dist` communicator.
        original_key: the observation to aggregate, e.g. ``'main/loss'``.
        aggregated_key: where the result goes (default ``original_key``).
        comm_trigger: when to combine (default every iteration).
        aggregator: ``aggregator(lists)`` from one list of values per rank
            (those kept since the last combination) to the result.
    """

    trigger = 1, 'iteration'
    priority = extension.PRIORITY_EDITOR

    def __init__(self, comm, original_key, aggregated_key=None, *,
                 comm_trigger=(1, 'iteration'), aggregator=None):
        self.comm, self.original_key = comm, original_key
        self.aggregated_key = aggregated_key or original_key
        self.comm_trigger = get_trigger(comm_trigger)
        self.aggregator = aggregator or _mean_of_all
        self.observation_history = []

    def compute_summary(self, trainer):
        """Keep this iteration's value; when ``comm_trigger`` fires, the
        aggregate over every rank (else None)."""
        value = trainer.observation.get(self.original_key)
        if value is not None:
            if isinstance(value, Variable):
                value = value.array
            self.observation_history.append(
                backend.to_cpu(value) if backend.is_array(value) else value)
        if not self.comm_trigger(trainer):
            return None
        histories = self.comm.gather_obj(self.observation_history)
        self.observation_history = []
        summary = self.aggregator(histories) if self.comm.rank == 0 else None
        return self.comm.bcast_obj(summary)

    def __call__(self, trainer):
        summary = self.compute_summary(trainer)
        if summary is not None:
            trainer.observation[self.aggregated_key] = summary


class MultiNodeEarlyStoppingTrigger:
    """A stop trigger for early stopping, the same decision on every rank.

    At each ``check_trigger`` the mean of ``monitor`` over every rank and
    every iteration since the last check is compared with the best so far;
    after ``patience`` checks without improvement it fires, on every rank
    at once. It also fires at ``max_trigger``.

    Args:
        comm: a :mod:`minichain.dist` communicator.
        check_trigger: how often to compare.
        monitor: the observation, e.g. ``'validation/main/loss'``.
        patience: checks without improvement before stopping (default 3;
            ``patients`` is the old spelling).
        mode: ``'min'``, ``'max'`` or ``'auto'`` (max for a name holding
            ``'accuracy'``, else min).
        verbose: print when it stops.
        max_trigger: stop anyway at this point.
        suffix: the mean over the ranks is observed as ``monitor + suffix``.
    """

    def __init__(self, comm, *, check_trigger=(1, 'epoch'),
                 monitor='main/loss', patience=None, mode='auto',
                 verbose=False, max_trigger=(100, 'epoch'),
                 suffix='_aggregated', patients=None):
        if patience is not None and patients is not None:
            raise TypeError('MultiNodeEarlyStoppingTrigger: give patience, '
                            'not also its old name patients')
        self.patience = patience or patients or 3
        self.monitor, self.verbose = monitor + suffix, verbose
        self.aggregator = ObservationAggregator(
            comm, monitor, self.monitor, comm_trigger=check_trigger)
        self._check = get_trigger(check_trigger)
        self._max = get_trigger(max_trigger)
        if mode == 'auto':
            mode = 'max' if 'accuracy' in monitor else 'min'
        self._better = operator.gt if mode == 'max' else operator.lt
        self.best = float('-inf') if mode == 'max' else float('inf')
        self.count = 0
        self._summary = DictSummary()

    def __call__(self, trainer):
        self.aggregator(trainer)
        if self.monitor in trainer.observation:
            self._summary.add({self.monitor:
                               trainer.observation[self.monitor]})
        if self._max(trainer):
            return True
        if not self._check(trainer):
            return False
        if self.monitor not in trainer.observation:
            warnings.warn('MultiNodeEarlyStoppingTrigger: {} is not in the '
                          'observation'.format(self.monitor))
            return False
        value = self._summary.compute_mean()[self.monitor]
        self._summary = DictSummary()
        if self._better(value, self.best):
            self.best, self.count = value, 0
        else:
            self.count += 1
        if self.count >= self.patience:
            if self.verbose:
                print('Epoch {}: early stopping'.format(
                    trainer.updater.epoch))
            return True
        return False

    def get_training_length(self):
        """The length of ``max_trigger`` (for a progress bar)."""
        return self._max.get_training_length()


class AllreducePersistent(extension.Extension):
    """Replace the model's floating-point persistent values (batch
    normalization's running mean and variance) by their mean over every
    rank, in place (integers and scalars are left alone). Collective; run it
    before evaluating or saving the model (every epoch by default).

    Args:
        model: the link.
        comm: a :mod:`minichain.dist` communicator.
    """

    trigger = 1, 'epoch'
    priority = extension.PRIORITY_WRITER + 1  # before the evaluators

    def __init__(self, model, comm):
        self.model, self.comm = model, comm

    def __call__(self, trainer=None):
        for _, value in self.model.namedpersistents():  # sorted by path
            if backend.is_array(value) and value.dtype.kind == 'f':
                value[...] = self.comm.allreduce(value, 'mean')  # in place
