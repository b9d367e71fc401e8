"""PlotReport: reported values plotted into a PNG (matplotlib)."""
import json
import os

from minichain.reporter import DictSummary
from minichain.serializers import atomic_write
from minichain.training import extension
from minichain.training.extensions.log_report import to_float
from minichain.training.triggers import get_trigger

__all__ = ['PlotReport']


def _import_matplotlib():
    """Figure and the Agg canvas; no pyplot, so no global backend state."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as e:
        raise ImportError('PlotReport needs matplotlib: pip install '
                          'matplotlib'
                          ) from e
    return Figure, FigureCanvasAgg


class PlotReport(extension.Extension):
    """Plots the interval means of ``y_keys`` against ``x_key``.

    Like LogReport it averages the observation over each interval of
    ``trigger``; after each interval it redraws ``out/<file_name>`` (written
    atomically) with one line per key.

    Args:
        y_keys: a key or a list of keys, e.g. ``['main/loss',
            'validation/main/loss']``.
        x_key: ``'epoch'``, ``'iteration'`` or another observed key.
        trigger: the interval, ``(1, 'epoch')`` by default.
        file_name: the PNG file under ``trainer.out``.
        marker: matplotlib marker of the points (None: lines only).
        grid: draw a grid.

    Raises:
        ImportError: matplotlib is not installed (``available()`` tells
            beforehand).
    """

    def __init__(self, y_keys, x_key='epoch', trigger=(1, 'epoch'),
                 file_name='plot.png', marker='x', grid=True):
        _import_matplotlib()
        self._y_keys = [y_keys] if isinstance(y_keys, str) else list(y_keys)
        self._x_key = x_key
        self._trigger = get_trigger(trigger)
        self._file_name = file_name
        self._marker = marker
        self._grid = grid
        self._summary = DictSummary()
        self._data = {k: [] for k in self._y_keys}

    @staticmethod
    def available():
        """True when matplotlib can be imported."""
        try:
            _import_matplotlib()
        except ImportError:
            return False
        return True

    @property
    def data(self):
        """``{key: [(x, y), ...]}`` plotted so far."""
        return self._data

    def __call__(self, trainer):
        observation = trainer.observation
        keys = self._y_keys + [self._x_key]
        self._summary.add({k: observation[k] for k in keys
                           if k in observation})
        if not (trainer.is_before_training or self._trigger(trainer)):
            return
        stats = {k: to_float(v)
                 for k, v in self._summary.compute_mean().items()}
        self._summary = DictSummary()
        stats['epoch'] = trainer.updater.epoch
        stats['iteration'] = trainer.updater.iteration
        if self._x_key not in stats:
            return
        x = stats[self._x_key]
        for key in self._y_keys:
            if key in stats:
                self._data[key].append((x, stats[key]))
        self._plot(os.path.join(trainer.out, self._file_name))

    def _plot(self, path):
        Figure, FigureCanvasAgg = _import_matplotlib()
        figure = Figure()
        FigureCanvasAgg(figure)
        axes = figure.add_subplot(1, 1, 1)
        for key in self._y_keys:
            points = self._data[key]
            if points:
                xs, ys = zip(*points)
                axes.plot(xs, ys, marker=self._marker, label=key)
        axes.set_xlabel(self._x_key)
        if any(self._data.values()):
            axes.legend(loc='best')
        axes.grid(self._grid)
        try:
            with atomic_write(path) as f:
                figure.savefig(f, format='png')
        except Exception as e:
            cause = _os_error_in(e)
            if cause is None:
                raise
            # One line: matplotlib's PNG writer chains a full disk into an
            # AttributeError of its own cleanup (73 lines of traceback).
            raise OSError(cause.errno, 'PlotReport: cannot write the plot: '
                          '{}'.format(cause.strerror or cause), path) from None

    def serialize(self, serializer):
        """Save or load the plotted points and the partial interval."""
        if hasattr(self._trigger, 'serialize'):
            self._trigger.serialize(serializer['_trigger'])
        self._summary.serialize(serializer['_summary'])
        data = json.loads(serializer('_plot_data', json.dumps(self._data)))
        self._data = {k: [tuple(p) for p in data.get(k, [])]
                      for k in self._y_keys}


def _os_error_in(error):
    """The first OSError among ``error`` and its causes and contexts."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, OSError):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None
