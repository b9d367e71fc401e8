"""Iterator: the protocol of dataset iterators."""

__all__ = ['Iterator']


class Iterator:
    """Base class of dataset iterators.

    ``next(it)`` returns a list of examples (a batch). Subclasses provide
    ``__next__``, ``epoch``, ``epoch_detail``, ``previous_epoch_detail``,
    ``is_new_epoch``, ``reset()`` and ``serialize(serializer)``.
    """

    def __iter__(self):
        return self

    def __next__(self):
        raise NotImplementedError(type(self).__name__ + '.__next__')

    def next(self):
        """Chainer's spelling of ``next(it)``."""
        return self.__next__()

    def finalize(self):
        """Release resources (threads, files); nothing by default."""

    def serialize(self, serializer):
        """Save or load the iteration state; nothing by default."""
