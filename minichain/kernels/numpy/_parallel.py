"""CPU work split over minichain's own threads: products and elementwise.

The kernels (``_cpu_kernels.py``, ``_im2col.py``,
``_normalization_kernels.py``) call these inside
:func:`minichain.host.cpu_kernel_scope`, which keeps the BLAS on one thread
and tells how many threads the kernel may use (the BLAS's count on entry).

Products. A convolution's image chunks go to the threads in contiguous runs
(:func:`over_chunks`: each thread builds its own columns and multiplies
them, so the column copies run in parallel too, where BLAS threads would
leave them to one core), and a lone large product is cut into row blocks
(:func:`matmul`).

Elementwise. NumPy runs every ufunc on one core, but it releases the GIL
inside its loops over contiguous arrays, so cutting an array into row
blocks and running the blocks on a few threads does use the other cores
(:func:`split_rows`, :func:`elementwise`; how many:
:func:`minichain.host.host_threads`). Only NumPy arrays come here; CuPy has
its own kernels.
"""
import concurrent.futures
import os
import threading

import numpy

from minichain import backend, host
from minichain.kernels.numpy import _layout

# Below this many bytes a block costs less than handing it to a thread.
_MIN_BYTES = 1 << 20
# Below this many multiply-adds a product is not worth cutting up.
_MIN_PRODUCT = 1 << 22
_lock = threading.Lock()
_pool = {}
_local = threading.local()  # .busy: this thread runs a share of a split


def _executor(workers):
    with _lock:
        ex = _pool.get(workers)
        if ex is None:
            ex = concurrent.futures.ThreadPoolExecutor(
                workers, thread_name_prefix='minichain-cpu')
            _pool[workers] = ex
        return ex


def _forget_pools_after_fork():
    # A forked child (a data-loading worker) has none of the parent's
    # threads: a pool inherited from the parent would take work and never
    # run it. The child starts pools of its own when it needs them.
    global _lock
    _lock = threading.Lock()
    _pool.clear()


if hasattr(os, 'register_at_fork'):
    os.register_at_fork(after_in_child=_forget_pools_after_fork)


def split_rows(fn, rows, nbytes):
    """Call ``fn(slice)`` on row blocks that together cover ``range(rows)``.

    The calls run concurrently (the caller takes the first block) when
    ``nbytes``, the size of the data touched, is large and more than one
    host thread is allowed, outside a share of another split; otherwise
    ``fn(slice(0, rows))`` runs once.
    ``fn`` must write disjoint rows for disjoint slices.

    Args:
        fn: callable taking a ``slice`` of the leading axis.
        rows: length of the leading axis.
        nbytes: bytes the whole call reads and writes.
    """
    n = 1 if getattr(_local, 'busy', False) else min(
        host.host_threads(), rows, max(1, nbytes // _MIN_BYTES))
    if n < 2:
        fn(slice(0, rows))
        return
    _run_shares(fn, _even_slices(rows, n))


def elementwise(kernel, out, *arrays):
    """Run ``kernel(out_block, *array_blocks)`` over blocks of ``out``.

    Every array must have ``out``'s shape. When all of them are dense in one
    memory order (C-contiguous, channel-major: ``_layout.flat_views``) the
    blocks are pieces of their flat memory; otherwise (any strides) they
    are taken along the leading axis. Anything else (0-d, mismatched
    shapes) runs as one ``kernel(out, *arrays)``.

    Returns:
        out.
    """
    if out.ndim == 0 or any(a.shape != out.shape for a in arrays):
        kernel(out, *arrays)
        return out
    views = _layout.flat_views(out, *arrays) or (out,) + arrays
    split_rows(lambda s: kernel(*(a[s] for a in views)),
               views[0].shape[0], out.nbytes * (1 + len(arrays)))
    return out


def add_into(out, a):
    """``out += a`` (one shape), by blocks over the threads as
    :func:`elementwise` cuts them. Returns out."""
    return elementwise(lambda o, b: numpy.add(o, b, out=o), out, a)


def product_threads():
    """Threads a product started now may use: 1 inside a share of a split
    (no nesting), else the current op's count."""
    if getattr(_local, 'busy', False):
        return 1
    return host.cpu_kernel_threads()


def _even_slices(length, n):
    """``n`` contiguous slices of near-equal length covering range(length)."""
    bounds = [length * i // n for i in range(n + 1)]
    return [slice(bounds[i], bounds[i + 1]) for i in range(n)]


def _share(fn, arg):
    _local.busy = True
    try:
        return fn(arg)
    finally:
        _local.busy = False


def _run_shares(fn, shares):
    """fn(share) for every share, the first on the calling thread; results
    in order. Every share is waited for before an error propagates."""
    futures = [_executor(len(shares) - 1).submit(_share, fn, s)
               for s in shares[1:]]
    try:
        first = _share(fn, shares[0])
    finally:
        rest = [f.result() for f in futures]
    return [first] + rest


def over_chunks(fn, chunks):
    """Call ``fn(run)`` on contiguous runs of ``chunks``, one per thread.

    Chunks are dealt out in order and in equal-length runs, so a sum over
    the results (a weight gradient) is the same for the same thread count.

    Args:
        fn: callable taking a list of chunks; must touch only its chunks'
            outputs (anything shared it returns instead).
        chunks: list of work items (image ranges).
    Returns:
        list of ``fn``'s results, one per run (a single one when the op
        has one thread or there is one chunk).
    """
    n = min(product_threads(), len(chunks))
    if n < 2:
        return [fn(list(chunks))]
    return _run_shares(fn, [list(chunks[s])
                            for s in _even_slices(len(chunks), n)])


def matmul(a, b, out=None):
    """``numpy.matmul(a, b, out=out)``, cut into row blocks over the op's
    threads when the product is large; other array types go to their own
    ``matmul`` (cuBLAS for CuPy).

    Only 2-D and same-batch 3-D operands are cut (along ``a``'s rows);
    anything else is one call.
    """
    if not (isinstance(a, numpy.ndarray) and isinstance(b, numpy.ndarray)):
        xp = backend.get_array_module(a, b)
        return xp.matmul(a, b) if out is None else xp.matmul(a, b, out=out)
    rows = a.shape[-2] if a.ndim >= 2 else 1
    n = min(product_threads(), rows)
    simple = (a.ndim == b.ndim and a.ndim in (2, 3)
              and a.shape[:-2] == b.shape[:-2])
    if (n < 2 or not simple
            or a.size * b.shape[-1] < _MIN_PRODUCT):
        return numpy.matmul(a, b, out=out)
    if out is None:
        out = numpy.empty(a.shape[:-1] + b.shape[-1:],
                          numpy.result_type(a, b))
    _run_shares(lambda s: numpy.matmul(a[..., s, :], b, out=out[..., s, :]),
                _even_slices(rows, n))
    return out


_scratch = threading.local()  # .buffers: workspace's arrays, by name


def workspace(name, shape, dtype):
    """A per-thread scratch array, reused across calls (never returned).

    Fresh multi-megabyte arrays cost page faults on every call; these
    transient buffers (col chunks, transposed chunks) are reused instead.
    """
    store = _scratch.__dict__.setdefault('buffers', {})
    dtype = numpy.dtype(dtype)
    nbytes = int(numpy.prod(shape)) * dtype.itemsize
    buf = store.get(name)
    if buf is None or buf.nbytes < nbytes:
        buf = numpy.empty(nbytes, dtype=numpy.uint8)
        store[name] = buf
    return buf[:nbytes].view(dtype).reshape(shape)
