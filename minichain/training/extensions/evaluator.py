"""Evaluator: the mean of the reported metrics over a validation set."""
import copy

from minichain import backend
from minichain import reporter as reporter_module
from minichain.configuration import no_backprop_mode, using_config
from minichain.dataset.convert import concat_examples
from minichain.training import extension
from minichain.training.extensions.progress_bar import BatchProgress

__all__ = ['Evaluator']


def _batch_size(arrays, batch):
    """Examples actually converted (a converter may drop some)."""
    if isinstance(arrays, tuple) and arrays:
        first = arrays[0]
    elif isinstance(arrays, dict) and arrays:
        first = next(iter(arrays.values()))
    else:
        first = arrays
    return len(first) if backend.is_array(first) else len(batch)


class Evaluator(extension.Extension):
    """Runs the target over a whole dataset in test mode and reports the
    mean of what it reports.

    For each batch the target is called as in ``StandardUpdater``, with
    ``config.train = False`` and no graph recorded. Every value the target
    reports (e.g. Classifier's ``loss`` and ``accuracy``) is averaged over
    the set, each batch weighted by its number of examples, so the result is
    the per-example mean even when the last batch is short. In a Trainer,
    values are reported as ``'<name>/main/loss'`` where ``<name>`` is the
    extension's name (``'validation'`` by default).

    Args:
        iterator: an iterator with ``repeat=False`` (or a dict of them with
            a 'main' entry); it is reset before each evaluation.
        target: the link to evaluate (or a dict with a 'main' entry).
        converter: batch -> arrays (default ``concat_examples``).
        device: where batches go (any ``get_device`` spec, or None).
        eval_hook: called with the evaluator before each evaluation.
        eval_func: called instead of the 'main' target.
        progress_bar: show the evaluation's progress on stdout (a tqdm bar
            that disappears when it is done, below the training bar; see
            ``progress_bar.BatchProgress``). In a data-parallel job, pass
            ``progress_bar=comm.rank == 0``.

    Calling the evaluator returns ``{key: mean}`` (host or GPU scalars).
    """

    trigger = (1, 'epoch')
    priority = extension.PRIORITY_WRITER
    default_name = 'validation'

    def __init__(self, iterator, target, converter=concat_examples,
                 device=None, eval_hook=None, eval_func=None, *,
                 progress_bar=False):
        self._iterators = iterator if isinstance(iterator, dict) else {
            'main': iterator}
        self._targets = target if isinstance(target, dict) else {
            'main': target}
        for name, it in self._iterators.items():
            if getattr(it, 'repeat', False):
                raise ValueError('Evaluator: iterator {!r} repeats forever; '
                                 'create it with repeat=False'.format(name))
        self.converter = converter
        self.device = None
        if device is not None:
            from minichain.device import get_device
            self.device = get_device(device)
        self.eval_hook = eval_hook
        self.eval_func = eval_func
        self.progress_bar = progress_bar

    def get_iterator(self, name='main'):
        """The iterator called ``name``."""
        return self._iterators[name]

    def get_target(self, name='main'):
        """The target called ``name``."""
        return self._targets[name]

    def get_all_targets(self):
        """``{name: target}``."""
        return dict(self._targets)

    def __call__(self, trainer=None):
        """Evaluate, report the means to the current reporter (if any) and
        return them."""
        result = self.evaluate()
        reporter_module.report(result)
        return result

    def _make_reporter(self):
        reporter = reporter_module.Reporter()
        prefix = (self.name or self.default_name) + '/'
        for name, target in self._targets.items():
            reporter.add_observer(prefix + name, target)
            if hasattr(target, 'namedlinks'):
                reporter.add_observers(prefix + name,
                                       target.namedlinks(skipself=True))
        return reporter

    def evaluate(self):
        """``{key: per-example mean}`` over the whole iterator, keys such
        as ``'validation/main/loss'``."""
        return self.evaluate_summary().compute_mean()

    def evaluate_summary(self):
        """Run the evaluation and return the DictSummary of weighted sums
        (a multi-process evaluator combines these before dividing)."""
        if self.eval_hook is not None:
            self.eval_hook(self)
        iterator = self._iterators['main']
        eval_func = self.eval_func or self._targets['main']
        if hasattr(iterator, 'reset'):
            iterator.reset()
            it = iterator
        else:
            it = copy.copy(iterator)
        reporter = self._make_reporter()
        summary = reporter_module.DictSummary()
        progress = BatchProgress(iterator, self.name or self.default_name) \
            if self.progress_bar else None
        try:
            for batch in it:
                observation, n = self._evaluate_batch(reporter, eval_func,
                                                      batch)
                summary.add(observation, weight=n)
                if progress is not None:
                    progress.update()
        finally:
            if progress is not None:
                progress.close()
        return summary

    def _evaluate_batch(self, reporter, eval_func, batch):
        """``(observation, examples)`` of one batch, in test mode."""
        observation = {}
        with reporter.scope(observation), using_config('train', False):
            arrays = self.converter(batch, self.device)
            with no_backprop_mode():
                if isinstance(arrays, tuple):
                    eval_func(*arrays)
                elif isinstance(arrays, dict):
                    eval_func(**arrays)
                else:
                    eval_func(arrays)
        return observation, _batch_size(arrays, batch)
