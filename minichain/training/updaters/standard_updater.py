"""StandardUpdater: one batch, one forward/backward, one optimizer step."""
from minichain.dataset.convert import concat_examples
from minichain.training.updater import Updater

__all__ = ['StandardUpdater']


def _as_dict(where, what, value):
    if not isinstance(value, dict):
        return {'main': value}
    if 'main' not in value:
        raise ValueError("{}: a dict of {} needs a 'main' entry, got keys {}"
                         .format(where, what, sorted(value)))
    return dict(value)


class StandardUpdater(Updater):
    """The usual training iteration.

    Each ``update()`` takes the next batch of the 'main' iterator, converts
    it (``converter(batch, device)``), and calls
    ``optimizer.update(loss_func, *arrays)`` on the 'main' optimizer (``**``
    for a dict batch; one argument for a single array). After the batch
    that ends an epoch it calls ``optimizer.new_epoch()``.

    Args:
        iterator: an iterator, or a dict of them with a 'main' entry.
        optimizer: an optimizer already ``setup`` with its link, or a dict
            of them with a 'main' entry.
        converter: batch -> arrays (default ``concat_examples``).
        device: where batches go (any ``get_device`` spec); when given, the
            optimizers' links are moved there too. None leaves both alone.
        loss_func: the loss function; default the 'main' optimizer's link.

    Attributes:
        iteration: number of updates so far.
    """

    def __init__(self, iterator, optimizer, converter=concat_examples,
                 device=None, loss_func=None):
        where = 'StandardUpdater'
        self._iterators = _as_dict(where, 'iterators', iterator)
        self._optimizers = _as_dict(where, 'optimizers', optimizer)
        for name, opt in self._optimizers.items():
            if getattr(opt, 'target', None) is None:
                raise ValueError('{}: optimizer {!r} has no target; call '
                                 'optimizer.setup(model) first'.format(
                                     where, name))
        self.converter = converter
        self.loss_func = loss_func
        self.device = None
        if device is not None:
            from minichain.device import get_device
            self.device = get_device(device)
            for opt in self._optimizers.values():
                opt.target.to_device(self.device)
        self.iteration = 0

    # -- progress, read from the main iterator ----------------------------
    @property
    def epoch(self):
        """Completed epochs of the main iterator."""
        return self._iterators['main'].epoch

    @property
    def epoch_detail(self):
        """Epochs of the main iterator, with a fraction."""
        return self._iterators['main'].epoch_detail

    @property
    def previous_epoch_detail(self):
        """``epoch_detail`` before the last update (None before the
        first)."""
        return self._iterators['main'].previous_epoch_detail

    @property
    def is_new_epoch(self):
        """True right after the update that completed an epoch."""
        return self._iterators['main'].is_new_epoch

    # -- access ---------------------------------------------------------------
    def get_iterator(self, name='main'):
        """The iterator called ``name``."""
        return self._iterators[name]

    def get_optimizer(self, name='main'):
        """The optimizer called ``name``."""
        return self._optimizers[name]

    def get_all_optimizers(self):
        """``{name: optimizer}``."""
        return dict(self._optimizers)

    # -- work -----------------------------------------------------------------
    def update(self):
        """Run one iteration and count it."""
        self.update_core()
        self.iteration += 1

    def update_core(self):
        """One batch, one step (override for other schemes)."""
        iterator = self._iterators['main']
        optimizer = self._optimizers['main']
        batch = next(iterator)
        arrays = self.converter(batch, self.device)
        loss_func = self.loss_func or optimizer.target
        if isinstance(arrays, tuple):
            optimizer.update(loss_func, *arrays)
        elif isinstance(arrays, dict):
            optimizer.update(loss_func, **arrays)
        else:
            optimizer.update(loss_func, arrays)
        if iterator.is_new_epoch:
            optimizer.new_epoch()

    def finalize(self):
        """Finalize every iterator."""
        for iterator in self._iterators.values():
            finalize = getattr(iterator, 'finalize', None)
            if finalize is not None:
                finalize()

    def serialize(self, serializer):
        """Save or load iterators (``iterator:<name>``), optimizers
        (``optimizer:<name>``), their links (``model:<name>``) and the
        iteration count, under Chainer's keys."""
        for name, iterator in self._iterators.items():
            iterator.serialize(serializer['iterator:' + name])
        for name, optimizer in self._optimizers.items():
            optimizer.serialize(serializer['optimizer:' + name])
            optimizer.target.serialize(serializer['model:' + name])
        self.iteration = int(serializer('iteration', self.iteration))
