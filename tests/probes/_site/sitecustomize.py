"""Imported by every Python process of a probe's job (the probe puts this
folder on PYTHONPATH): a thread notes the files that the job must not
leave behind, and, when asked, limits the size of the files the process
writes once MPI has started (a full disk, without filling one).

``PROBE_RECORD``: a folder; each process appends to ``<pid>.txt`` the
shared-memory files it maps (/dev/shm/...) and the temporary files its
parent holds open (Hydra's topology file), one path a line.
``PROBE_FSIZE``: bytes; once ``mpi4py.MPI`` is initialized, files larger
than that cannot be written (EFBIG instead of SIGXFSZ). Not set before
MPI starts: MPICH's own shared-memory file is larger.
"""
import os
import signal
import sys
import threading
import time

_RECORD = os.environ.get('PROBE_RECORD')
_FSIZE = int(os.environ.get('PROBE_FSIZE', '0') or 0)


def _mapped():
    found = set()
    try:
        with open('/proc/self/maps') as f:
            for line in f:
                row = line.rstrip('\n').split(None, 5)
                if len(row) == 6 and row[5].startswith('/dev/shm/'):
                    found.add(row[5].replace(' (deleted)', ''))
    except OSError:
        pass
    fd_dir = '/proc/{}/fd'.format(os.getppid())
    try:
        fds = os.listdir(fd_dir)
    except OSError:
        fds = []
    for fd in fds:
        try:
            target = os.readlink(os.path.join(fd_dir, fd))
        except OSError:
            continue
        if os.path.basename(target).startswith('hydra_hwloc_xmlfile_'):
            found.add(target.replace(' (deleted)', ''))
    return found


def _watch():
    seen, limited = set(), not _FSIZE
    path = os.path.join(_RECORD, '{}.txt'.format(os.getpid()))
    while True:
        new = _mapped() - seen
        if new:
            seen |= new
            with open(path, 'a') as f:
                f.write(''.join(p + '\n' for p in sorted(new)))
        if not limited:
            # mpi4py.MPI sits in sys.modules while it is still being
            # imported: its functions may not be there yet.
            initialized = getattr(sys.modules.get('mpi4py.MPI'),
                                  'Is_initialized', None)
            if initialized is not None and initialized():
                import resource
                resource.setrlimit(resource.RLIMIT_FSIZE, (_FSIZE, _FSIZE))
                limited = True
        time.sleep(0.02)


if _RECORD:
    if _FSIZE:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    threading.Thread(target=_watch, name='probe-watch', daemon=True).start()
