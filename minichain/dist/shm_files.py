"""MPICH's shared-memory file and Hydra's topology file, unlinked early.

On one machine MPICH's ranks share a segment, a file
``/dev/shm/mpich_shm_*`` (2 MB for two ranks) that one rank creates in
``MPI_Init`` and removes in ``MPI_Finalize``; Hydra's proxy
(``hydra_pmi_proxy``, the ranks' parent) writes the machine's topology to
``/tmp/hydra_hwloc_xmlfile_*`` for the ranks to read in ``MPI_Init`` and
removes it when the job ends. A job that ends through ``MPI_Abort`` (an
uncaught exception, the stall watchdog), or whose rank is killed, skips
both removals: the proxy SIGKILLs the ranks and exits (seen with
``strace -f -e openat,unlink``), and every such job left 2 MB of
memory-backed storage and a file behind.

Once every rank has opened them, neither file is needed by its name any
more: like a temporary file unlinked as soon as it is open, the memory
stays mapped until the last rank exits, and the kernel frees it however the
job ends. So the first communicator over all ranks unlinks both names
(:func:`release_after_init`), and the abort paths unlink again whatever
segment was mapped since (:func:`release`); MPICH's and Hydra's own
removals at a normal exit then find nothing to remove, which both ignore.
Only files that this process has mapped, or that its parent proxy holds
open, are touched: other jobs' files on the same machine are left alone.
Other MPIs (Open MPI, Slurm's PMI) are left as they are: nothing matches.

An abort also skips Python's own exit, which removes multiprocessing's
temporary folder (``pymp-*`` in the temp dir, which holds the socket of a
MultiprocessIterator's forkserver): :func:`before_abort` removes it too.
A rank killed by the launcher because another rank aborted cannot, unless
it was aborting as well (both ranks meet the same error).
"""
import contextlib
import os
import shutil
import sys

SEGMENT_PREFIX = '/dev/shm/mpich_shm_'
HWLOC_PREFIX = 'hydra_hwloc_xmlfile_'
PROXY = 'hydra_pmi_proxy'
_DELETED = ' (deleted)'  # how /proc shows a name already unlinked

_state = {'released': False}


def mapped_segments(maps='/proc/self/maps'):
    """MPICH's shared-memory files that this process maps, by path (those
    still linked)."""
    try:
        with open(maps) as f:
            fields = [line.rstrip('\n').split(None, 5) for line in f]
    except OSError:  # no /proc (not Linux)
        return []
    paths = {row[5] for row in fields if len(row) == 6}
    return sorted(p for p in paths
                  if p.startswith(SEGMENT_PREFIX) and not p.endswith(_DELETED))


def proxy_files(ppid=None):
    """Hydra's topology files that this process's parent holds open, when the
    parent is Hydra's proxy (empty otherwise)."""
    ppid = os.getppid() if ppid is None else ppid
    proc = '/proc/{}'.format(ppid)
    try:
        with open(proc + '/cmdline', 'rb') as f:
            program = f.read().split(b'\0')[0].decode(errors='replace')
        fds = os.listdir(proc + '/fd')
    except OSError:
        return []
    if os.path.basename(program) != PROXY:
        return []
    found = set()
    for fd in fds:
        try:
            target = os.readlink('{}/fd/{}'.format(proc, fd))
        except OSError:  # closed meanwhile
            continue
        if (os.path.basename(target).startswith(HWLOC_PREFIX)
                and not target.endswith(_DELETED)):
            found.add(target)
    return sorted(found)


def release():
    """Unlink this process's MPICH segments and its proxy's topology file
    (call only once every rank on this machine is past ``MPI_Init``, or
    when the job is ending); returns the paths unlinked."""
    gone = []
    for path in mapped_segments() + proxy_files():
        with contextlib.suppress(OSError):  # another rank here was first
            os.unlink(path)
            gone.append(path)
    return gone


def release_after_init(mpi_comm, world):
    """:func:`release` once per process, at the end of the first collective
    over a communicator of all ``world``'s ranks (``mpi_comm``; all of them
    have then opened both files)."""
    if _state['released'] or mpi_comm.size != world.size:
        return
    _state['released'] = True
    release()


def before_abort():
    """What ``MPI_Abort`` skips: :func:`release`, and multiprocessing's
    temporary folder of this process (when multiprocessing is in use)."""
    release()
    util = sys.modules.get('multiprocessing.util')
    if util is not None:
        # get_temp_dir creates the folder if none yet: removed anyway
        with contextlib.suppress(OSError):
            shutil.rmtree(util.get_temp_dir(), ignore_errors=True)
