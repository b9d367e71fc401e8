"""Extension: something the Trainer calls when its trigger fires.

An extension is any callable ``ext(trainer)``; these optional attributes
refine it: ``trigger`` (default ``(1, 'iteration')``), ``priority`` (higher
runs first in an iteration; default ``PRIORITY_READER``),
``call_before_training`` (also run once before the first update; default
False), ``default_name``,
``initialize(trainer)`` (called by ``Trainer.run`` before the first
iteration, also after resuming), ``finalize()`` (called when training ends,
even by an error) and ``serialize(serializer)`` (state kept in snapshots).
Subclass ``Extension`` or decorate a function with ``make_extension``.
"""

__all__ = ['Extension', 'make_extension', 'PRIORITY_WRITER',
           'PRIORITY_EDITOR', 'PRIORITY_READER', 'PRIORITY_SNAPSHOT']

PRIORITY_WRITER = 300    # adds to the observation (Evaluator, observe_lr)
PRIORITY_EDITOR = 200    # edits the observation
PRIORITY_READER = 100    # only reads it (LogReport, PrintReport)
PRIORITY_SNAPSHOT = -100  # runs last, so a snapshot holds everything


class Extension:
    """Base class of trainer extensions (see the module docstring).

    Attributes:
        trigger: the default trigger, ``(1, 'iteration')``.
        priority: the default priority, ``PRIORITY_READER``.
        call_before_training: the default of ``Trainer.extend``'s flag of
            that name, False.
        name: the name the trainer registered it under (set by
            ``Trainer.extend``; None before).
    """

    trigger = (1, 'iteration')
    priority = PRIORITY_READER
    call_before_training = False
    name = None

    @property
    def default_name(self):
        """The name used when ``extend`` is given none: the class name."""
        return type(self).__name__

    def __call__(self, trainer):
        """Run the extension (subclasses)."""
        raise NotImplementedError(type(self).__name__ + '.__call__')

    def initialize(self, trainer):
        """Prepare before the first iteration of ``run``."""

    def finalize(self):
        """Release resources at the end of training."""

    def serialize(self, serializer):
        """Save or load state kept in snapshots (none by default)."""


def make_extension(trigger=None, default_name=None, priority=None,
                   finalizer=None, initializer=None):
    """Decorator that turns a function ``f(trainer)`` into an extension.

    Example::

        @make_extension(trigger=(1, 'epoch'))
        def halve_lr(trainer):
            trainer.updater.get_optimizer('main').lr /= 2

    Args:
        trigger: default trigger (``(1, 'iteration')`` if None).
        default_name: default name (the function's name if None).
        priority: default priority (``PRIORITY_READER`` if None).
        finalizer: called with no argument when training ends.
        initializer: called with the trainer before the first iteration.
    """
    def decorator(ext):
        ext.trigger = (1, 'iteration') if trigger is None else trigger
        ext.default_name = default_name or ext.__name__
        ext.priority = PRIORITY_READER if priority is None else priority
        if finalizer is not None:
            ext.finalize = finalizer
        if initializer is not None:
            ext.initialize = initializer
        return ext
    return decorator
