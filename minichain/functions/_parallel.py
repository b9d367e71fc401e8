"""Large elementwise NumPy work split over the host's threads.

NumPy runs every ufunc on one core, so on a small machine the elementwise
part of a training step (batch normalization, ReLU, additions: about a
sixth of a ResNet-50 step) stays serial while BLAS uses all cores. NumPy
releases the GIL inside its loops over contiguous arrays, so cutting an
array into row blocks and running the blocks on a few threads does use
the other cores. The thread count is
:func:`minichain.backend.host_threads` (1 unless set with
:func:`minichain.backend.set_host_threads` or ``MINICHAIN_HOST_THREADS``;
see there why). Only NumPy arrays come here; CuPy has its own kernels.
"""
import concurrent.futures
import threading

from minichain import backend

# Below this many bytes a block costs less than handing it to a thread.
_MIN_BYTES = 1 << 20
_lock = threading.Lock()
_pool = {}


def _executor(workers):
    with _lock:
        ex = _pool.get(workers)
        if ex is None:
            ex = concurrent.futures.ThreadPoolExecutor(
                workers, thread_name_prefix='minichain-elementwise')
            _pool[workers] = ex
        return ex


def split_rows(fn, rows, nbytes):
    """Call ``fn(slice)`` on row blocks that together cover ``range(rows)``.

    The calls run concurrently (the caller takes the first block) when
    ``nbytes``, the size of the data touched, is large and more than one
    host thread is allowed; otherwise ``fn(slice(0, rows))`` runs once.
    ``fn`` must write disjoint rows for disjoint slices.

    Args:
        fn: callable taking a ``slice`` of the leading axis.
        rows: length of the leading axis.
        nbytes: bytes the whole call reads and writes.
    """
    n = min(backend.host_threads(), rows, max(1, nbytes // _MIN_BYTES))
    if n < 2:
        fn(slice(0, rows))
        return
    bounds = [rows * i // n for i in range(n + 1)]
    blocks = [slice(bounds[i], bounds[i + 1]) for i in range(n)]
    futures = [_executor(n - 1).submit(fn, s) for s in blocks[1:]]
    try:
        fn(blocks[0])
    finally:
        for f in futures:
            f.result()


def elementwise(kernel, out, *arrays):
    """Run ``kernel(out_block, *array_blocks)`` over row blocks of ``out``.

    Every array must have ``out``'s shape (any strides); blocks are taken
    along the leading axis. Anything else (0-d, mismatched shapes) runs as
    one ``kernel(out, *arrays)``.

    Returns:
        out.
    """
    if out.ndim == 0 or any(a.shape != out.shape for a in arrays):
        kernel(out, *arrays)
        return out
    split_rows(lambda s: kernel(out[s], *(a[s] for a in arrays)),
               out.shape[0], out.nbytes * (1 + len(arrays)))
    return out
