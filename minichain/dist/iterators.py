"""ChainerMN's ``chainermn.iterators``: the same batches on several ranks.

For a model split over processes whose pieces all need the batch (an
encoder on one rank, a decoder that needs the targets on another):

* :func:`create_multi_node_iterator`: one rank reads the batches and sends
  them to the others (the data travels every iteration);
* :func:`create_synchronized_iterator`: every rank reads its own copy of
  the dataset in the same order (nothing travels after the start).
"""
from minichain.dataset.iterator import Iterator
from minichain.serializers import DictionarySerializer, NpzDeserializer

__all__ = ['create_multi_node_iterator', 'create_synchronized_iterator']


class MultiNodeIterator(Iterator):
    """The batches of ``rank_master``'s iterator, on every rank of
    ``comm`` (see :func:`create_multi_node_iterator`)."""

    def __init__(self, actual_iterator, comm, rank_master=0):
        self.comm, self.rank_master = comm, rank_master
        master = comm.rank == rank_master
        self.actual = actual_iterator if master else None
        self._state = comm.bcast_obj(self._read(None) if master else None,
                                     root=rank_master)

    def _read(self, batch):
        it = self.actual
        return {'batch': batch, 'epoch': it.epoch,
                'epoch_detail': it.epoch_detail,
                'previous_epoch_detail': it.previous_epoch_detail,
                'is_new_epoch': it.is_new_epoch,
                'current_position': getattr(it, 'current_position', None)}

    def __next__(self):
        state = None
        if self.actual is not None:
            try:
                state = self._read(next(self.actual))
            except StopIteration:
                state = dict(self._read(None), stop=True)
        # Everything a rank may ask the iterator, with the batch: every
        # rank then tells the same epoch and stops at the same batch.
        self._state = self.comm.bcast_obj(state, root=self.rank_master)
        if self._state.get('stop'):
            raise StopIteration
        return self._state['batch']

    epoch = property(lambda self: self._state['epoch'])
    epoch_detail = property(lambda self: self._state['epoch_detail'])
    previous_epoch_detail = property(
        lambda self: self._state['previous_epoch_detail'])
    is_new_epoch = property(lambda self: self._state['is_new_epoch'])
    current_position = property(lambda self: self._state['current_position'])

    def reset(self):
        """Reset the master's iterator (collective: every rank calls it,
        as an Evaluator does before each evaluation)."""
        if self.actual is not None:
            self.actual.reset()
        self._state = self.comm.bcast_obj(
            self._read(None) if self.actual is not None else None,
            root=self.rank_master)

    def serialize(self, serializer):
        """The master's iterator's state; the other ranks hold none (they
        take the master's at the next batch)."""
        if self.actual is not None:
            self.actual.serialize(serializer)


def create_multi_node_iterator(actual_iterator, communicator, rank_master=0):
    """An iterator that gives every rank ``rank_master``'s batches.

    Only ``rank_master`` reads from ``actual_iterator`` (any iterator; the
    other ranks may pass None); each batch, with the epoch counters, is
    broadcast to every rank of ``communicator``, so that every rank gets
    the same batches and stops at the same one. Every rank must call it,
    and then ``next``, ``reset`` and ``serialize``, together.

    Args:
        actual_iterator: the iterator that reads the data, on
            ``rank_master``.
        communicator: a :mod:`minichain.dist` communicator.
        rank_master: the rank that reads.
    Returns:
        An iterator (the batches are lists of examples, of any picklable
        kind).
    """
    return MultiNodeIterator(actual_iterator, communicator, rank_master)


def create_synchronized_iterator(actual_iterator, communicator):
    """``actual_iterator``, continuing with rank 0's seed and position.

    Every rank holds the same dataset and its own iterator over it; rank
    0's seeded shuffling state (the seed, the position, the current order)
    is copied to every rank's iterator, so that all of them visit the
    examples in the same order from then on, without sending data.
    Collective.

    Args:
        actual_iterator: a seeded iterator (``SerialIterator`` or
            ``MultiprocessIterator``) over a dataset of the same length on
            every rank.
        communicator: a :mod:`minichain.dist` communicator.
    Returns:
        ``actual_iterator`` itself.
    Raises:
        ValueError: the iterator has no seed (it cannot be synchronized).
    """
    if not hasattr(actual_iterator, 'seed'):
        raise ValueError('create_synchronized_iterator: {} has no seed to '
                         'share: use a SerialIterator or a '
                         'MultiprocessIterator'.format(
                             type(actual_iterator).__name__))
    state = DictionarySerializer()
    if communicator.rank == 0:
        actual_iterator.serialize(state)
    state = communicator.bcast_obj(state.target, root=0)
    actual_iterator.serialize(NpzDeserializer(state))
    return actual_iterator
