"""Trainer: the training loop, with extensions around each iteration."""
import collections
import contextlib
import os
import time

from minichain.reporter import Reporter
from minichain.training import extension as extension_module
from minichain.training.triggers import get_trigger

__all__ = ['Trainer']

_Entry = collections.namedtuple(
    '_Entry', 'extension trigger priority call_before_training')


class Trainer:
    """Runs ``updater.update()`` until ``stop_trigger`` fires, calling the
    extensions whose triggers fire after each iteration.

    Each iteration runs inside ``reporter.scope(observation)``: whatever the
    model and the extensions report lands in ``trainer.observation`` (a
    fresh dict per iteration), under names such as ``'main/loss'`` (the
    'main' optimizer's link is registered as ``'main'``, its children as
    ``'main/<path>'``).

    Example::

        trainer = Trainer(updater, (20, 'epoch'), out='result')
        trainer.extend(extensions.LogReport())
        trainer.run()

    Args:
        updater: the Updater.
        stop_trigger: a trigger or ``(period, unit)``; None never stops.
        out: the output folder (created by ``run``).
        extensions: extensions to ``extend`` with their defaults.

    Attributes:
        updater, stop_trigger, out, reporter, observation.
    """

    def __init__(self, updater, stop_trigger=None, out='result',
                 extensions=None):
        self.updater = updater
        self.stop_trigger = get_trigger(stop_trigger)
        self.out = os.fspath(out)
        self.observation = {}
        self.reporter = Reporter()
        for name, optimizer in updater.get_all_optimizers().items():
            self.reporter.add_observer(name, optimizer.target)
            self.reporter.add_observers(
                name, optimizer.target.namedlinks(skipself=True))
        self._extensions = collections.OrderedDict()
        self._start_at = None
        self._end_at = None
        self._previous_elapsed = 0.0  # time spent before the last resume
        # perf_counter() when the last update returned, before this
        # iteration's extensions (an evaluation is no training time: the
        # ProgressBar's images/s)
        self.last_update_at = None
        self._done = False
        updater.connect_trainer(self)
        for ext in extensions or ():
            self.extend(ext)

    @property
    def elapsed_time(self):
        """Seconds spent in ``run``, including runs before a resume."""
        if self._start_at is None:
            return self._previous_elapsed
        end = time.time() if self._end_at is None else self._end_at
        return self._previous_elapsed + end - self._start_at

    @property
    def is_before_training(self):
        """True until the first update (``updater.iteration == 0``): what
        extensions called with ``call_before_training`` check to report
        before any trigger fired."""
        return self.updater.iteration == 0

    def extend(self, extension, name=None, trigger=None, priority=None, *,
               call_before_training=None):
        """Register an extension.

        Args:
            extension: a callable ``ext(trainer)``, usually an Extension.
            name: its name; default ``extension.name`` or
                ``extension.default_name`` or its ``__name__``. A taken name
                gets a suffix ``_1``, ``_2``, ...; the final name is set as
                ``extension.name``.
            trigger: when it runs; default ``extension.trigger`` or
                ``(1, 'iteration')``.
            priority: order inside an iteration (higher first); default
                ``extension.priority`` or ``PRIORITY_READER``.
            call_before_training: also call it once when ``run`` starts,
                before the first update (not when resuming a trainer that
                already trained); default ``extension.call_before_training``
                or False. An Evaluator, a LogReport and a PrintReport
                extended this way log the untrained model as epoch 0.
        """
        if self._start_at is not None:
            raise RuntimeError('Trainer.extend: cannot add extensions after '
                               'run() started')
        if not callable(extension):
            raise TypeError('Trainer.extend: the extension must be callable, '
                            'got {}'.format(type(extension).__name__))
        if name is None:
            name = (getattr(extension, 'name', None)
                    or getattr(extension, 'default_name', None)
                    or getattr(extension, '__name__', None))
        if not name:
            raise TypeError('Trainer.extend: give a name for {!r}'.format(
                extension))
        if trigger is None:
            trigger = getattr(extension, 'trigger', (1, 'iteration'))
        if priority is None:
            priority = getattr(extension, 'priority',
                               extension_module.PRIORITY_READER)
        if call_before_training is None:
            call_before_training = getattr(extension, 'call_before_training',
                                           False)
        unique, i = name, 0
        while unique in self._extensions:
            i += 1
            unique = '{}_{}'.format(name, i)
        with contextlib.suppress(AttributeError):  # e.g. a bound method
            extension.name = unique
        self._extensions[unique] = _Entry(extension, get_trigger(trigger),
                                          priority, bool(call_before_training))

    def get_extension(self, name):
        """The extension registered as ``name``."""
        if name not in self._extensions:
            raise KeyError('Trainer.get_extension: no extension named {!r}; '
                           'registered: {}'.format(name,
                                                   list(self._extensions)))
        return self._extensions[name].extension

    def run(self):
        """Run the training loop until the stop trigger fires.

        Creates ``out``, calls each extension's ``initialize(trainer)``,
        then, before the first update only, the extensions registered with
        ``call_before_training``, then iterates; every extension's
        ``finalize()`` and the updater's ``finalize()`` run at the end, also
        when an error stops training.
        """
        if self._done:
            raise RuntimeError('Trainer.run: this trainer has already run; '
                               'make a new one (and load a snapshot into it '
                               'to continue)')
        os.makedirs(self.out, exist_ok=True)
        entries = sorted(self._extensions.items(),
                         key=lambda item: item[1].priority, reverse=True)
        self._start_at = time.time()
        try:
            for _, entry in entries:
                initialize = getattr(entry.extension, 'initialize', None)
                if initialize is not None:
                    initialize(self)
            if self.is_before_training:  # not after a resume (or autoload)
                self.observation = {}
                with self.reporter.scope(self.observation):
                    for _, entry in entries:
                        if entry.call_before_training:
                            entry.extension(self)
            while not self.stop_trigger(self):
                self.observation = {}
                with self.reporter.scope(self.observation):
                    self.updater.update()
                    self.last_update_at = time.perf_counter()
                    for _, entry in entries:
                        if entry.trigger(self):
                            entry.extension(self)
        finally:
            self._end_at = time.time()
            self._done = True
            for _, entry in entries:
                finalize = getattr(entry.extension, 'finalize', None)
                if finalize is not None:
                    finalize()
            self.updater.finalize()

    def serialize(self, serializer):
        """Save or load the updater (``updater/``), the stop trigger, every
        extension (``extensions/<name>/``) and its trigger
        (``extension_triggers/<name>/``), for those with ``serialize``, and
        the elapsed time.

        When loading, the saved state of extensions that this trainer does
        not have is skipped, as Chainer does: in a data-parallel script only
        rank 0 has LogReport and PrintReport, and every rank resumes from
        rank 0's snapshot. Every key under the extensions it has must still
        be read (with ``load_npz``'s ``strict``).
        """
        from minichain.serializers import Deserializer
        self.updater.serialize(serializer['updater'])
        if hasattr(self.stop_trigger, 'serialize'):
            self.stop_trigger.serialize(serializer['stop_trigger'])
        s_ext = serializer['extensions']
        s_trig = serializer['extension_triggers']
        for name, entry in self._extensions.items():
            if hasattr(entry.extension, 'serialize'):
                entry.extension.serialize(s_ext[name])
            if hasattr(entry.trigger, 'serialize'):
                entry.trigger.serialize(s_trig[name])
        if isinstance(serializer, Deserializer):
            for section in (s_ext, s_trig):
                for name in section.children():
                    if name not in self._extensions:
                        section[name].skip()
            self._previous_elapsed = float(
                serializer('_snapshot_elapsed_time', 0.0))
        else:
            serializer('_snapshot_elapsed_time', self.elapsed_time)
