"""PrintReport: the LogReport's entries as a table on a stream."""
import numbers

from minichain.training import extension
from minichain.training.extensions.log_report import LogReport
from minichain.training.extensions.progress_bar import write

__all__ = ['PrintReport']


class PrintReport(extension.Extension):
    """Prints chosen entries of the log, one row per log entry.

    The header is printed once, before the first row. Columns are at
    least 10 characters wide (the entry name's length if longer); numbers
    are printed with ``'{:g}'``, missing values as blanks. Rows go above a
    ProgressBar's tqdm bar on the same stream, not into it.

    Args:
        entries: the keys to print, e.g. ``['epoch', 'main/loss',
            'validation/main/accuracy', 'elapsed_time']``.
        log_report: the LogReport, or its name in the trainer.
        out: the stream (``sys.stdout`` by default).
    """

    def __init__(self, entries, log_report='LogReport', out=None):
        self._entries = list(entries)
        self._log_report = log_report
        self._out = out
        self._widths = [max(10, len(e)) for e in self._entries]
        self._log_len = 0
        self._header_done = False

    def _write(self, text):
        write(text, self._out)

    def _row(self, values):
        cells = []
        for entry, width in zip(self._entries, self._widths):
            value = values.get(entry)
            if value is None:
                text = ''
            elif (isinstance(value, numbers.Real)
                  and not isinstance(value, bool)):
                text = '{:g}'.format(value)
            else:
                text = str(value)
            cells.append('{:<{w}}'.format(text, w=width))
        return '  '.join(cells).rstrip() + '\n'

    def __call__(self, trainer):
        log_report = self._log_report
        if isinstance(log_report, str):
            log_report = trainer.get_extension(log_report)
        elif isinstance(log_report, LogReport):
            log_report(trainer)  # we own it: advance it ourselves
        log = log_report.log
        if len(log) <= self._log_len:
            return
        rows = [self._row(entry) for entry in log[self._log_len:]]
        if not self._header_done:
            rows.insert(0, self._row({e: e for e in self._entries}))
            self._header_done = True
        self._write(''.join(rows))  # at once: the bar is redrawn once
        self._log_len = len(log)

    def serialize(self, serializer):
        """Save or load how many entries were printed (a resumed run does
        not print them again), and the owned LogReport, if any."""
        if isinstance(self._log_report, LogReport):
            self._log_report.serialize(serializer['_log_report'])
        self._log_len = int(serializer('_log_len', self._log_len))
