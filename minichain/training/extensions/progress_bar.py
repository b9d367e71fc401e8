"""ProgressBar: training progress on a terminal (tqdm when installed);
``write``: text printed above the bar; ``BatchProgress``: the progress of
a loop over batches (an evaluation)."""
import datetime
import math
import shutil
import sys
import time

from minichain import backend
from minichain.training import extension

__all__ = ['BatchProgress', 'ProgressBar', 'write']


def _load_tqdm():
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm


def _columns():
    """The width a bar may take: one less than the terminal's, so that it
    never wraps (clearing a wrapped bar clears only its last line, and every
    redraw would leave a copy above). A stream that is not a terminal (a
    rank's output under mpiexec is a pipe) counts as 80 columns."""
    return shutil.get_terminal_size((80, 24)).columns - 1


def _rows():
    """The terminal's height, 24 when it reports none. Passed to tqdm
    because a terminal of unknown size (Open MPI gives each rank a pseudo
    terminal of 0 x 0) reads to tqdm as -1 rows, and it then draws nothing."""
    return shutil.get_terminal_size((80, 24)).lines


def write(text, out=None):
    """Write ``text`` on ``out`` (``sys.stdout``) above the tqdm bars drawn
    there: they are cleared first and drawn again below it, so that a table
    printed during training (PrintReport) does not mix with a bar."""
    out = out or sys.stdout
    tqdm = _load_tqdm()
    if tqdm is None:
        out.write(text)
    else:
        tqdm.write(text, file=out, end='')
    out.flush()


class ProgressBar(extension.Extension):
    """Shows how far training is.

    With tqdm installed (``pip install tqdm``) it draws a
    tqdm bar, never wider than the terminal, whose count follows every
    iteration and whose text is redrawn every ``update_interval``;
    otherwise it prints one plain line every ``update_interval``:
    ``epoch 1.5/10 (15.0%)  iteration 300  25.1 iters/sec  ETA 0:00:34``.

    ``entries`` adds observed values, such as ``main/loss``, each under the
    last part of its name and averaged over iterations (an exponential
    moving average, 0.1 for the newest value). The averages stay where the
    model computed them (a GPU scalar on the GPU: reading one waits for
    every queued kernel) and reach the host only when the text is redrawn.
    ``images_per_iteration`` adds the throughput since the last redraw, in
    images per second, in place of tqdm's iterations per second.

    Example (rank 0 of a data-parallel job)::

        trainer.extend(extensions.ProgressBar(
            update_interval=10, entries=['main/loss', 'main/accuracy'],
            images_per_iteration=batchsize * comm.size))

    A stop trigger whose ``get_training_length()`` returns None does not
    know the length yet (one that fixes it from the measured speed, say):
    the bar starts at the first iteration after it does.

    Args:
        training_length: ``(length, unit)``; None takes it from the
            trainer's stop trigger (which must have
            ``get_training_length()``, as IntervalTrigger does).
        update_interval: redraw every this many iterations.
        out: the stream (``sys.stdout`` by default).
        use_tqdm: True/False to force a style; None: tqdm if installed.
        entries: observation keys to show.
        images_per_iteration: the examples of one iteration over all ranks
            (the global batch), to show images per second.
    """

    def __init__(self, training_length=None, update_interval=100, out=None,
                 use_tqdm=None, *, entries=(), images_per_iteration=None):
        if update_interval <= 0:
            raise ValueError('ProgressBar: update_interval must be positive, '
                             'got {}'.format(update_interval))
        self._length = training_length
        self._update_interval = int(update_interval)
        self._out = out
        self._tqdm = _load_tqdm() if use_tqdm is not False else None
        if use_tqdm and self._tqdm is None:
            raise ImportError('ProgressBar: use_tqdm=True but tqdm is not '
                              'installed: pip install tqdm')
        self._entries = list(entries)
        self._images = images_per_iteration
        self._average = {}
        self._bar = None
        self._start = None  # (time, iteration, current) at the first call
        self._last = None   # (current, iteration) of the last call
        self._shown = None
        self._rate_from = None  # (time, iteration) of the last redraw
        self._seen_at = None  # perf_counter() at the last iteration seen

    def _resolve_length(self, trainer):
        if self._length is None:
            get = getattr(trainer.stop_trigger, 'get_training_length', None)
            if get is None:
                raise ValueError('ProgressBar: the stop trigger has no '
                                 'get_training_length(); pass '
                                 'training_length=(length, unit)')
            self._length = get()  # None: ask again next time
        return self._length

    def __call__(self, trainer):
        if self._resolve_length(trainer) is None:
            return  # not known yet: nothing to draw a bar against
        length, unit = self._length
        updater = trainer.updater
        iteration = updater.iteration
        if unit == 'iteration':
            current = iteration
        else:
            current = round(updater.epoch_detail, 2)
        current = min(current, length)  # the last batch may run past it
        # the rate is taken when the update ended, not now: the extensions
        # before this one, such as the evaluation at the last iteration,
        # are no training time (a trainer other than ours: now)
        at = getattr(trainer, 'last_update_at', None)
        self._seen_at = time.perf_counter() if at is None else at
        if self._start is None:
            self._start = (time.time(), iteration, current)
            self._rate_from = (self._seen_at, iteration)
            if self._tqdm is not None:
                # initial= makes tqdm's rate count only progress made from
                # here on, not the first interval divided by ~0 seconds.
                rate = '' if self._images else ', {rate_fmt}'
                self._bar = self._tqdm(
                    total=length, unit=unit, leave=True, initial=current,
                    file=self._out or sys.stdout, ncols=_columns(),
                    nrows=_rows(),
                    bar_format='{l_bar}{bar}| {n_fmt}/{total_fmt} '
                    '[{elapsed}<{remaining}' + rate + '{postfix}]')
        self._last = (current, iteration)
        for key in self._entries:
            if key in trainer.observation:
                value = trainer.observation[key]
                value = getattr(value, 'array', value)  # a Variable's
                old = self._average.get(key)
                self._average[key] = value if old is None else \
                    0.9 * old + 0.1 * value
        if iteration % self._update_interval == 0:
            self._show()
        elif self._bar is not None:  # the count moves on; tqdm throttles
            self._bar.update(current - self._bar.n)

    def _extras(self):
        """The entries' averages and the images per second, as text: the
        only place the averages come to the host."""
        parts = ['{} {:.3f}'.format(key.rsplit('/', 1)[-1],
                                    float(backend.to_cpu(value)))
                 for key, value in self._average.items()]
        now, iteration = self._seen_at, self._last[1]
        then, before = self._rate_from
        if self._images and iteration > before:
            self._rate_from = (now, iteration)
            parts.append('{:.1f} img/s'.format(
                (iteration - before) * self._images / max(now - then, 1e-9)))
        return parts

    def _show(self):
        current, iteration = self._last
        if self._shown == self._last:
            return
        self._shown = self._last
        length, unit = self._length
        out = self._out or sys.stdout
        extras = self._extras()
        if self._tqdm is not None:
            self._bar.n = current
            if unit != 'iteration':
                extras.insert(0, 'iteration {}'.format(iteration))
            self._bar.set_postfix_str('  '.join(extras), refresh=False)
            self._bar.refresh()
            return
        start_time, start_iteration, start_current = self._start
        elapsed = time.time() - start_time
        done = current - start_current  # progress made in this process
        rate = (iteration - start_iteration) / elapsed if elapsed > 0 else 0.
        line = '{} {}/{} ({:.1f}%)  iteration {}  {:.3g} iters/sec'.format(
            unit, current, length, 100 * current / length,
            iteration, rate)
        if done > 0 and current < length:
            seconds = elapsed * (length - current) / done
            line += '  ETA {}'.format(datetime.timedelta(
                seconds=round(seconds)))
        out.write('  '.join([line] + extras) + '\n')
        out.flush()

    def finalize(self):
        """Show the final state and close the bar."""
        if self._last is not None:
            self._show()
        if self._bar is not None:
            self._bar.close()
            self._bar = None


class BatchProgress:
    """The progress of a loop over an iterator's batches, as a context
    manager::

        with BatchProgress(iterator, 'validation') as progress:
            for batch in iterator:
                ...
                progress.update()


    A tqdm bar that disappears when the loop ends (below the training bar,
    if one is shown), or without tqdm a line at each tenth of the batches.
    The number of batches is ``ceil(len(it.dataset) / it.batch_size)`` when
    the iterator has both (a multi-node evaluator's rank shows its shard).
    """

    def __init__(self, iterator, desc, out=None):
        self.out = out or sys.stdout
        self.desc = desc
        n, size = len(getattr(iterator, 'dataset', ()) or ()), getattr(
            iterator, 'batch_size', None)
        self.total = math.ceil(n / size) if n and size else None
        self.done = 0
        self._bar = None
        tqdm = _load_tqdm()
        if tqdm is not None:
            self._bar = tqdm(total=self.total, desc=desc, unit='batch',
                             file=self.out, leave=False, ncols=_columns(),
                             nrows=_rows())

    def update(self):
        """Count one batch."""
        self.done += 1
        if self._bar is not None:
            self._bar.update(1)
        elif self.total and (10 * self.done // self.total
                             > 10 * (self.done - 1) // self.total):
            self.out.write('{} {}/{} batches\n'.format(self.desc, self.done,
                                                       self.total))
            self.out.flush()

    def close(self):
        """Remove the bar (call it when the loop ends, also on an error)."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
