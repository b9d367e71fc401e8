"""Updater: the object that performs one training iteration."""

__all__ = ['Updater']


class Updater:
    """Base class of updaters.

    An updater owns the iterators and optimizers; ``update()`` performs one
    iteration. The Trainer reads ``iteration``, ``epoch``, ``epoch_detail``,
    ``previous_epoch_detail`` and ``is_new_epoch`` from it.
    """

    def connect_trainer(self, trainer):
        """Called by the Trainer that runs this updater; nothing by
        default."""

    def finalize(self):
        """Release resources at the end of training."""

    def get_optimizer(self, name='main'):
        """The optimizer called ``name`` (subclasses)."""
        raise NotImplementedError(type(self).__name__ + '.get_optimizer')

    def get_all_optimizers(self):
        """``{name: optimizer}`` (subclasses)."""
        raise NotImplementedError(type(self).__name__ + '.get_all_optimizers')

    def update(self):
        """Run one iteration (subclasses)."""
        raise NotImplementedError(type(self).__name__ + '.update')

    def serialize(self, serializer):
        """Save or load the state kept in snapshots (subclasses)."""
        raise NotImplementedError(type(self).__name__ + '.serialize')
