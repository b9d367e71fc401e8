"""Work split over the host's threads: large elementwise passes and products.

NumPy runs every ufunc on one core, so on a small machine the elementwise
part of a training step (batch normalization, ReLU, additions: about a
sixth of a ResNet-50 step) stays serial while BLAS uses all cores. NumPy
releases the GIL inside its loops over contiguous arrays, so cutting an
array into row blocks and running the blocks on a few threads does use
the other cores. The thread count is
:func:`minichain.backend.host_threads` (1 unless set with
:func:`minichain.backend.set_host_threads` or ``MINICHAIN_HOST_THREADS``;
see there why). Only NumPy arrays come here; CuPy has its own kernels.

With more than one host thread, the convolutions' matrix products are
split here too (:func:`matmul`), each part a single-threaded BLAS call:
``set_host_threads`` then sets BLAS to one thread. Why not leave products
to BLAS's own threads? On the 2-core development machine a step that
mixed OpenBLAS-threaded products with serial NumPy passes ran in one of
two modes, switching between steps of one process: 1.7 s or 2.3 s at
batch 8 / 224 (2.3 s or 3.8 s at 32 / 32), while OpenBLAS's threads spun
through every serial pass. Split here, with threads that sleep between
calls, the same steps stayed at 1.7 s and 2.3-2.4 s.
"""
import concurrent.futures
import threading

import numpy

from minichain import backend

# Below this many bytes a block costs less than handing it to a thread.
_MIN_BYTES = 1 << 20
# Below this many multiply-adds a product costs less than a thread hand-off.
_MIN_MACS = 1 << 23
# Split points of a product are multiples of this (whole SIMD registers).
_ALIGN = 16
_lock = threading.Lock()
_pool = {}


def _executor(workers):
    with _lock:
        ex = _pool.get(workers)
        if ex is None:
            ex = concurrent.futures.ThreadPoolExecutor(
                workers, thread_name_prefix='minichain-host')
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


def matmul(a, b, out=None):
    """``numpy.matmul(a, b, out=out)``, split over the host threads.

    ``a`` (..., M, K) and ``b`` (..., K, N) with equal leading dimensions
    (any strides BLAS accepts). With one host thread, or a small product,
    this is one ``numpy.matmul``. Otherwise the longer of M and N is cut
    into one part per thread, each written straight into its slice of
    ``out`` (a column slice of a row-major matrix is still a BLAS operand:
    only its row stride differs), so the result equals one call's.
    """
    workers = backend.host_threads()
    if (workers < 2 or a.ndim != b.ndim or a.ndim not in (2, 3)
            or a.shape[:-2] != b.shape[:-2]):
        return numpy.matmul(a, b) if out is None else numpy.matmul(
            a, b, out=out)
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    macs = m * k * n * (a.shape[0] if a.ndim == 3 else 1)
    along_n = n >= m
    length = n if along_n else m
    parts = min(workers, macs // _MIN_MACS, length // _ALIGN)
    if parts < 2:
        return numpy.matmul(a, b) if out is None else numpy.matmul(
            a, b, out=out)
    if out is None:
        out = numpy.empty(a.shape[:-1] + (n,), numpy.result_type(a, b))
    cuts = [length * i // parts // _ALIGN * _ALIGN for i in range(parts)]
    cuts.append(length)

    def part(i):
        s = slice(cuts[i], cuts[i + 1])
        if along_n:
            numpy.matmul(a, b[..., s], out=out[..., s])
        else:
            numpy.matmul(a[..., s, :], b, out=out[..., s, :])

    futures = [_executor(parts - 1).submit(part, i) for i in range(1, parts)]
    try:
        part(0)
    finally:
        for f in futures:
            f.result()
    return out
