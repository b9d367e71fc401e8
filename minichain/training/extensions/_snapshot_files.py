"""The snapshot files already in a trainer's ``out`` folder: which match a
snapshot's file name pattern, which is the newest (``autoload``), and which
are stale (``n_retains``).

A pattern such as ``'snapshot_iter_{.updater.iteration}'`` matches the
names it can produce: its literal text exactly, each ``{...}`` field as one
or more characters (not ``/``). Files are ordered by modification time, as
Chainer orders them, with ties broken by the numbers in their names; the
hidden temporary files of an unfinished write (``.name.pid.tmp``) never
match.
"""
import contextlib
import os
import re
import string

__all__ = ['check_pattern', 'matching', 'newest', 'remove_stale',
           'stale_temporaries']

# What a write interrupted by a signal or a kill leaves: ``.NAME.PID.tmp``
# (Snapshot) and ``.NAME.PID.HEX.tmp`` (serializers.atomic_write), nested
# when one writes through the other.
_TEMPORARY = re.compile(r'^\.(?P<name>.+)\.(?P<pid>\d+)(\.[0-9a-f]{8})?\.tmp$')


def check_pattern(where, pattern):
    """Raise a ValueError naming ``where`` unless ``pattern`` is a string
    whose folder part (if any) has no ``{...}`` fields: the folder to scan
    must be known before the first snapshot exists."""
    if not isinstance(pattern, str):
        raise ValueError('{}: autoload and n_retains need a file name pattern '
                         '(a str), got {!r}'.format(where, pattern))
    folder, base = os.path.split(pattern)
    if '{' in folder or not base:
        raise ValueError('{}: autoload and n_retains need a filename whose '
                         'folder part has no {{}} fields and that names a '
                         'file, got {!r}'.format(where, pattern))


def _regex(base):
    parts = [re.escape(literal) + ('' if field is None else '[^/]+')
             for literal, field, _, _ in string.Formatter().parse(base)]
    return re.compile(''.join(parts) + r'\Z')


def _natural(name):
    return [(0, int(t), '') if t.isdigit() else (1, 0, t)
            for t in re.split(r'(\d+)', name)]


def matching(out, pattern):
    """Paths of the files under ``out`` that ``pattern`` names, oldest
    first."""
    folder, base = os.path.split(pattern)
    directory = os.path.join(out, folder)
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    regex = _regex(base)
    found = []
    for name in names:
        path = os.path.join(directory, name)
        if regex.match(name) and not name.startswith('.') \
                and os.path.isfile(path):
            found.append((os.stat(path).st_mtime_ns, _natural(name), path))
    return [path for _, _, path in sorted(found)]


def newest(out, pattern):
    """The newest matching file, or None."""
    files = matching(out, pattern)
    return files[-1] if files else None


def remove_stale(out, pattern, n_retains, keep):
    """Delete all but the newest ``n_retains`` matching files; ``keep`` (the
    file just written) is never deleted. Returns the deleted paths."""
    files = [p for p in matching(out, pattern)
             if os.path.abspath(p) != os.path.abspath(keep)]
    stale = files[:max(0, len(files) - (n_retains - 1))]
    for path in stale:
        # removed meanwhile: stale all the same
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)
    return stale


def stale_temporaries(folder, names):
    """The temporary files that interrupted snapshot or ``atomic_write``
    writes left in ``folder`` for files whose name matches one of the
    ``names`` patterns (``'snapshot_iter_{.updater.iteration}'``, ``'log'``),
    written by processes that no longer run on this machine. Only files
    named as these writers name them are listed (paths, sorted)."""
    patterns = [_regex(n) for n in names]
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
