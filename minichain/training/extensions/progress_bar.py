"""ProgressBar: training progress on a terminal (tqdm when installed)."""
import datetime
import sys
import time

from minichain.training import extension

__all__ = ['ProgressBar']


def _load_tqdm():
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm


class ProgressBar(extension.Extension):
    """Shows how far training is.

    With tqdm installed (``pip install "minichain[progress]"``) it draws a
    tqdm bar; otherwise it prints one plain line per update:
    ``epoch 1.5/10 (15.0%)  iteration 300  25.1 iters/sec  ETA 0:00:34``.

    Args:
        training_length: ``(length, unit)``; None takes it from the
            trainer's stop trigger (which must have
            ``get_training_length()``, as IntervalTrigger does).
        update_interval: redraw every this many iterations.
        out: the stream (``sys.stdout`` by default).
        use_tqdm: True/False to force a style; None: tqdm if installed.
    """

    def __init__(self, training_length=None, update_interval=100, out=None,
                 use_tqdm=None):
        if update_interval <= 0:
            raise ValueError('ProgressBar: update_interval must be positive, '
                             'got {}'.format(update_interval))
        self._length = training_length
        self._update_interval = int(update_interval)
        self._out = out
        self._tqdm = _load_tqdm() if use_tqdm is not False else None
        if use_tqdm and self._tqdm is None:
            raise ImportError('ProgressBar: use_tqdm=True but tqdm is not '
                              'installed: pip install "minichain[progress]"')
        self._bar = None
        self._start = None  # (time, iteration, current) at the first call
        self._last = None   # (current, iteration) of the last call
        self._shown = None

    def _resolve_length(self, trainer):
        if self._length is None:
            get = getattr(trainer.stop_trigger, 'get_training_length', None)
            if get is None:
                raise ValueError('ProgressBar: the stop trigger has no '
                                 'get_training_length(); pass '
                                 'training_length=(length, unit)')
            self._length = get()
        return self._length

    def __call__(self, trainer):
        length, unit = self._resolve_length(trainer)
        updater = trainer.updater
        iteration = updater.iteration
        if unit == 'iteration':
            current = iteration
        else:
            current = round(updater.epoch_detail, 2)
        current = min(current, length)  # the last batch may run past it
        if self._start is None:
            self._start = (time.time(), iteration, current)
        self._last = (current, iteration)
        if iteration % self._update_interval == 0:
            self._show()

    def _show(self):
        current, iteration = self._last
        if self._shown == self._last:
            return
        self._shown = self._last
        length, unit = self._length
        out = self._out or sys.stdout
        if self._tqdm is not None:
            if self._bar is None:
                # initial= makes tqdm's rate count only progress made from
                # here on, not the first interval divided by ~0 seconds.
                self._bar = self._tqdm(total=length, unit=unit, file=out,
                                       leave=True, initial=current)
            self._bar.n = current
            self._bar.set_postfix_str('iteration {}'.format(iteration),
                                      refresh=False)
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
        out.write(line + '\n')
        out.flush()

    def finalize(self):
        """Show the final state and close the bar."""
        if self._last is not None:
            self._show()
        if self._bar is not None:
            self._bar.close()
            self._bar = None
