"""Reporting metrics from anywhere in the model: Reporter, report, summaries.

A ``Reporter`` maps observers (links) to names. While one is active (``with
reporter:`` or ``reporter.scope(observation)``), ``report({'loss': loss},
link)`` stores ``observation['main/loss']`` when ``link`` was registered as
``'main'``. With no active reporter, ``report`` does nothing, so a model that
reports can run outside any training loop.

``Summary`` and ``DictSummary`` average reported values (weighted), the way
LogReport and Evaluator aggregate them.
"""
import contextlib
import json
import threading

import numpy

from minichain import backend
from minichain.variable import Variable

__all__ = ['Reporter', 'report', 'report_scope', 'get_current_reporter',
           'Summary', 'DictSummary']


class _Stack(threading.local):
    def __init__(self):
        self.reporters = []


# Per thread, as configuration is: a prefetching thread never reports into
# the main thread's observation.
_stack = _Stack()


def _detach(value):
    """A reported value without its graph: Variables become their arrays."""
    return value.array if isinstance(value, Variable) else value


class Reporter:
    """Collects observed values into ``observation`` (a dict).

    Attributes:
        observation: the dict receiving values while this reporter is
            active.
    """

    def __init__(self):
        self._names = {}
        self.observation = {}

    def __enter__(self):
        _stack.reporters.append(self)
        return self

    def __exit__(self, *exc):
        _stack.reporters.pop()

    @contextlib.contextmanager
    def scope(self, observation):
        """Make this reporter current and report into ``observation``
        inside a ``with`` block."""
        old = self.observation
        self.observation = observation
        self.__enter__()
        try:
            yield
        finally:
            self.__exit__()
            self.observation = old

    def add_observer(self, name, observer):
        """Register ``observer`` (any object, usually a link) as ``name``."""
        self._names[id(observer)] = name

    def add_observers(self, prefix, observers):
        """Register ``(name, observer)`` pairs as ``prefix + name``, e.g.
        ``add_observers('main', model.namedlinks(skipself=True))`` names
        the child ``/l1`` ``'main/l1'``."""
        for name, observer in observers:
            self._names[id(observer)] = prefix + name

    def report(self, values, observer=None):
        """Store ``values`` (a dict) in ``observation``.

        Keys are prefixed with ``observer``'s name and a slash when an
        observer is given. Variables are stored as their arrays (no graph).

        Raises:
            KeyError: ``observer`` was never registered.
        """
        if observer is not None:
            name = self._names.get(id(observer))
            if name is None:
                raise KeyError('Reporter.report: observer {} is not '
                               'registered; call add_observer(name, observer) '
                               'first'.format(type(observer).__name__))
            values = {'{}/{}'.format(name, k): v for k, v in values.items()}
        for key, value in values.items():
            self.observation[key] = _detach(value)


def get_current_reporter():
    """The innermost active Reporter (RuntimeError when none is active)."""
    if not _stack.reporters:
        raise RuntimeError('get_current_reporter: no reporter is active')
    return _stack.reporters[-1]


def report(values, observer=None):
    """Report ``values`` (a dict) to the current reporter, if any.

    Args:
        values: ``{name: value}``; values are scalars, 0-d arrays or
            Variables.
        observer: the reporting object (a link); its registered name
            prefixes each key.
    """
    if _stack.reporters:
        _stack.reporters[-1].report(values, observer)


@contextlib.contextmanager
def report_scope(observation):
    """Redirect reports of the current reporter into ``observation``."""
    with get_current_reporter().scope(observation):
        yield


def _scalar(where, value):
    value = _detach(value)
    if backend.is_array(value) and value.ndim != 0:
        raise ValueError('{}: expected a scalar, got an array of shape {}'
                         .format(where, value.shape))
    return value


class Summary:
    """A running weighted mean and standard deviation of scalars.

    .. math:: \\mu = \\frac{\\sum w_i x_i}{\\sum w_i}, \\qquad
              \\sigma = \\sqrt{\\frac{\\sum w_i x_i^2}{\\sum w_i} - \\mu^2}

    Values may be Python numbers, 0-d NumPy/CuPy arrays or Variables; GPU
    values stay on the GPU until the caller converts the result.
    """

    def __init__(self):
        self._x = 0.0
        self._x2 = 0.0
        self._n = 0.0

    def add(self, value, weight=1):
        """Add ``value`` with ``weight``."""
        value = _scalar('Summary.add', value)
        self._x = self._x + weight * value
        self._x2 = self._x2 + weight * value * value
        self._n += weight

    def compute_mean(self):
        """The weighted mean (ValueError if nothing was added)."""
        if self._n == 0:
            raise ValueError('Summary.compute_mean: nothing was added')
        return self._x / self._n

    def make_statistics(self):
        """``(mean, std)``."""
        mean = self.compute_mean()
        var = self._x2 / self._n - mean * mean
        xp = backend.get_array_module(var)
        return mean, xp.sqrt(xp.maximum(var, 0.0))

    def serialize(self, serializer):
        """Save or load the sums (as host floats)."""
        self._x = float(serializer('_x', float(self._x)))
        self._x2 = float(serializer('_x2', float(self._x2)))
        self._n = float(serializer('_n', float(self._n)))


def _is_scalar(value):
    return numpy.isscalar(value) or getattr(value, 'ndim', -1) == 0


class DictSummary:
    """A Summary per key of dicts of scalars (non-scalar values are
    ignored, as are non-numeric ones)."""

    def __init__(self):
        self._summaries = {}

    def add(self, d, weight=1):
        """Add every scalar entry of the dict ``d`` with ``weight``."""
        for key, value in d.items():
            value = _detach(value)
            if isinstance(value, (str, bytes)) or not _is_scalar(value):
                continue
            self._summaries.setdefault(key, Summary()).add(value, weight)

    def compute_mean(self):
        """``{key: mean}``."""
        return {k: s.compute_mean() for k, s in self._summaries.items()}

    def make_statistics(self):
        """``{key: mean, key + '.std': std}``."""
        stats = {}
        for key, summary in self._summaries.items():
            stats[key], stats[key + '.std'] = summary.make_statistics()
        return stats

    def serialize(self, serializer):
        """Save or load every key's Summary (keys stored as JSON)."""
        names = json.loads(serializer('_names',
                                      json.dumps(list(self._summaries))))
        self._summaries = {name: self._summaries.get(name, Summary())
                           for name in names}
        for index, name in enumerate(names):
            child = serializer['_summaries'][str(index)]
            self._summaries[name].serialize(child)
