"""snapshot and snapshot_object: save the trainer (or any object) to a file."""
import contextlib
import os
import re
import string

from minichain.training import extension

__all__ = ['Snapshot', 'snapshot', 'snapshot_object', 'stale_temporaries']

# What a write interrupted by a signal or a kill leaves: ``.NAME.PID.tmp``
# (Snapshot) and ``.NAME.PID.HEX.tmp`` (serializers.atomic_write), nested
# when one writes through the other.
_TEMPORARY = re.compile(r'^\.(?P<name>.+)\.(?P<pid>\d+)(\.[0-9a-f]{8})?\.tmp$')


def _default_savefun(path, obj):
    from minichain.serializers import save_npz
    save_npz(path, obj)


class Snapshot(extension.Extension):
    """Saves ``target`` (the trainer when None) to ``out/<filename>``.

    ``filename`` is formatted with the trainer (``'{.updater.iteration}'``
    is the iteration). The file is written under a temporary name in the
    same folder and renamed over the destination (``os.replace``), so an
    interrupted save never leaves a truncated snapshot.

    With ``n_retains``, each save then deletes the older files of this
    pattern in the folder (by modification time) so that ``n_retains`` are
    left, the one just written always among them.

    Args:
        target: the object to save (None: the trainer).
        filename: the file name pattern.
        savefun: ``savefun(path, obj)`` (default ``serializers.save_npz``).
        n_retains: how many files of the pattern to keep (None: all).
    """

    trigger = (1, 'epoch')
    priority = extension.PRIORITY_SNAPSHOT

    def __init__(self, target=None, filename='snapshot_iter_{.updater.'
                 'iteration}', savefun=None, n_retains=None):
        if n_retains is not None and n_retains < 1:
            raise ValueError('snapshot: n_retains must be at least 1 (the '
                             'newest snapshot is always kept), got {}'
                             .format(n_retains))
        self._target = target
        self._filename = filename
        self._savefun = savefun or _default_savefun
        self.n_retains = n_retains

    @property
    def default_name(self):
        """'snapshot' for the trainer, 'snapshot_object' otherwise."""
        return 'snapshot' if self._target is None else 'snapshot_object'

    def __call__(self, trainer):
        target = trainer if self._target is None else self._target
        name = self._filename.format(trainer)
        path = os.path.join(trainer.out, name)
        folder = os.path.dirname(path)
        if folder:
            os.makedirs(folder, exist_ok=True)
        tmp = os.path.join(folder, '.{}.{}.tmp'.format(os.path.basename(path),
                                                       os.getpid()))
        try:
            self._savefun(tmp, target)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        if self.n_retains is not None:
            self._remove_older(folder or '.', os.path.basename(path))

    def _remove_older(self, folder, newest):
        pattern = _pattern(os.path.basename(self._filename))
        found = []
        for entry in os.scandir(folder):
            if entry.is_file() and pattern.match(entry.name):
                found.append((entry.stat().st_mtime, entry.name))
        older = [name for _, name in sorted(found, reverse=True)
                 if name != newest]
        for name in older[self.n_retains - 1:]:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(folder, name))


def _pattern(filename):
    """A regex matching the names ``filename`` formats to (each field any
    text without a slash)."""
    parts = []
    for literal, field, _, _ in string.Formatter().parse(filename):
        parts.append(re.escape(literal))
        if field is not None:
            parts.append('[^/]+?')
    return re.compile('^' + ''.join(parts) + '$')


def stale_temporaries(folder, names):
    """The temporary files that interrupted snapshot or ``atomic_write``
    writes left in ``folder`` for files whose name matches one of the
    ``names`` patterns (``'snapshot_iter_{.updater.iteration}'``, ``'log'``),
    written by processes that no longer run on this machine. Only files
    named as these writers name them are listed (paths, sorted)."""
    patterns = [_pattern(n) for n in names]
    if not os.path.isdir(folder):
        return []
    out = []
    for entry in os.scandir(folder):
        name, pids = entry.name, []
        match = _TEMPORARY.match(name)
        while match:
            pids.append(int(match.group('pid')))
            name = match.group('name')
            match = _TEMPORARY.match(name)
        if (pids and entry.is_file() and any(p.match(name) for p in patterns)
                and not any(_running(pid) for pid in pids)):
            out.append(entry.path)
    return sorted(out)


def _running(pid):
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # someone else's process
        return True
    return True


def snapshot(filename='snapshot_iter_{.updater.iteration}', savefun=None,
             target=None, n_retains=None):
    """An extension that saves the whole trainer (model, optimizer,
    iterators, updater, extensions) every epoch by default.

    Resume with ``serializers.load_npz(path, trainer)`` on a trainer built
    the same way, before ``trainer.run()``.

    Args:
        filename: file name pattern, formatted with the trainer.
        savefun: ``savefun(path, obj)``; default ``serializers.save_npz``.
        target: save this object instead of the trainer.
        n_retains: keep only the newest this many files of the pattern
            (None: all).
    """
    return Snapshot(target, filename, savefun, n_retains)


def snapshot_object(target, filename, savefun=None, n_retains=None):
    """An extension that saves ``target`` (e.g. the model) to
    ``out/<filename>`` (formatted with the trainer), every epoch by
    default, keeping the newest ``n_retains`` files (None: all)."""
    return Snapshot(target, filename, savefun, n_retains)
