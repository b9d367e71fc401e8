"""The alpha-beta cost model of an allreduce, and ``explain(model, comm)``:
what one data-parallel step will send and how long it should take.

(``explain`` is exported as ``minichain.dist.explain``; this module is not
named after it, because importing a submodule ``dist.explain`` would
replace that function with the module.)

The prediction uses the alpha-beta model of a ring allreduce. Each of the
``p`` ranks holds ``n`` bytes; the ring runs ``p - 1`` reduce-scatter steps
and ``p - 1`` allgather steps, each moving ``n / p`` bytes over every link
and paying the latency ``alpha`` once, so with link bandwidth ``B``

.. math:: t(n, p) = \\frac{2(p-1)}{p} \\frac{n}{B} + 2(p-1)\\,\\alpha

(zero for one rank). A communicator's step is a sum of such terms: one per
parameter (naive), one per pipeline chunk (flat), one (pure_nccl), or one
inside the node plus one between nodes (hierarchical).
"""
import time

import numpy

from minichain import backend

__all__ = ['DEFAULTS', 'explain', 'measure', 'ring_allreduce_time']

# (alpha seconds, B bytes/second): rough figures, for when nothing is
# measured. MPI: one node, shared memory (MPICH/Open MPI reach 1-5 us and
# 5-10 GB/s; between nodes over 100 Gb/s Ethernet, 20 us and 10 GB/s).
# NCCL: GPUs of one node over NVLink (H100-class: 5-10 us per ring step,
# 100-400 GB/s bus bandwidth for large buffers). Measure with measure().
DEFAULTS = {'mpi': (5e-6, 5e9), 'nccl': (1e-5, 1e11)}
_BFLOAT16 = 'bfloat16'


def ring_allreduce_time(nbytes, size, latency, bandwidth):
    """Predicted seconds of a ring allreduce of ``nbytes`` per rank over
    ``size`` ranks: ``2(p-1)/p * n / bandwidth + 2(p-1) * latency``."""
    if size <= 1:
        return 0.0
    return (2.0 * (size - 1) / size * nbytes / bandwidth
            + 2.0 * (size - 1) * latency)


def measure(comm, nbytes=1 << 20, repeat=5):
    """Measure ``(latency, bandwidth)`` of MPI Allreduce on host buffers.

    Collective. Times an Allreduce of 4 bytes (latency only) and one of
    ``nbytes``; each rank keeps its best of ``repeat`` tries and the ranks
    agree on the slowest, then the alpha-beta model is solved for alpha and
    B. Returns None for one rank (nothing to measure).
    """
    mpi = comm.mpi_comm
    p = mpi.size
    if p == 1:
        return None
    from minichain.dist.mpi import import_mpi
    MPI = import_mpi()
    times = []
    for n in (1, max(1, nbytes // 4)):
        buf = numpy.zeros(n, dtype=numpy.float32)
        best = float('inf')
        for _ in range(repeat):
            mpi.Barrier()
            start = time.perf_counter()
            mpi.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
            best = min(best, time.perf_counter() - start)
        times.append(mpi.allreduce(best, op=MPI.MAX))
    latency = times[0] / (2.0 * (p - 1))
    transfer = max(times[1] - times[0], 1e-9)
    return latency, 2.0 * (p - 1) / p * (max(1, nbytes // 4) * 4) / transfer


def _itemsize(dtype):
    return 2 if dtype == _BFLOAT16 else numpy.dtype(dtype).itemsize


def _messages(comm, rows, on_gpu, dtype):
    """``[(nbytes, ranks, medium)]`` that one step sends, and a description."""
    from minichain.dist import mpi
    name, p = comm.name, comm.size
    total = sum(r[3] for r in rows)
    if name == 'naive':
        return ([(r[3], p, 'mpi') for r in rows],
                'one MPI Allreduce per parameter')
    if on_gpu and name == 'pure_nccl':
        return [(total, p, 'nccl')], 'one NCCL allreduce of the packed buffer'
    if on_gpu and name == 'hierarchical':
        intra, inter = comm.intra_size, comm.inter_size
        return ([(total, intra, 'nccl'), (total, inter, 'mpi')],
                'NCCL reduce + broadcast in each node ({} ranks), MPI '
                'Allreduce between {} nodes'.format(intra, inter))
    size = _itemsize(dtype)
    if on_gpu:
        chunk = max(1, mpi.CHUNK_BYTES // size) * size
        sizes = [min(chunk, total - lo) for lo in range(0, total, chunk)]
    else:  # the pieces the communicator cuts a host buffer in (no copy)
        like = numpy.broadcast_to(numpy.zeros((), dtype), (total // size,))
        sizes = [(hi - lo) * size for lo, hi in comm.pieces(like)]
        chunk = max(sizes, default=0)
    how = ('{} of the packed buffer in {} chunk{} of at most {:,} bytes'
           .format('the ring allreduce (minichain.dist.ring: Isend/Irecv)'
                   if name == 'ring' else 'MPI Allreduce', len(sizes),
                   '' if len(sizes) == 1 else 's', chunk))
    if on_gpu:
        how += ', staged through host memory'
    elif name in ('pure_nccl', 'hierarchical'):
        how += ' (NumPy arrays: the flat MPI path, not NCCL)'
    return [(n, p, 'mpi') for n in sizes], how


def explain(model, comm, batch_size=None, step_time=None, latency=None,
            bandwidth=None, calibrate=False, out=print):
    """Describe what one ``multi_node_mean_grad`` of ``model`` will do.

    Lists the parameters in packing order (``namedparams()``: sorted by
    path, the same on every rank) with shape, dtype, transfer bytes and
    offset in the packed buffer, the total, the transfer dtype, the
    communicator, and the predicted allreduce time from the alpha-beta
    model (see the module docstring and ``DEFAULTS``).

    Args:
        model: a Link with initialized parameters (uninitialized ones are
            named and left out).
        comm: a minichain.dist communicator.
        batch_size: samples per rank per step: adds the global batch and,
            with ``step_time``, the predicted throughput.
        step_time: seconds of one step's computation on one rank (forward,
            backward, update): adds the predicted step time without overlap
            and the scaling efficiency ``step_time / (step_time + t)``.
        latency, bandwidth: alpha (seconds) and B (bytes/second) for every
            message, instead of the defaults.
        calibrate: measure alpha and B of MPI messages first with
            :func:`measure` (collective: every rank must call explain).
        out: called with the text on rank 0 (default ``print``; None: quiet).
    Returns:
        the text (on every rank).
    """
    params = list(model.namedparams())
    live = [(n, p) for n, p in params if p.array is not None]
    uninit = [n for n, p in params if p.array is None]
    on_gpu = any(backend.get_device_id(p.array) >= 0 for _, p in live)
    wire = getattr(comm, 'allreduce_grad_dtype', None)
    own = comm.name == 'naive' and wire is None  # each gradient's own dtype
    if wire is None and live and not own:
        wire = numpy.result_type(*[p.dtype for _, p in live])
    rows, offset = [], 0
    for name, p in live:
        dtype = p.dtype if wire is None else wire
        nbytes = p.size * _itemsize(dtype)
        rows.append((name, tuple(p.shape), str(p.dtype), nbytes, offset))
        offset += nbytes
    model_params = {m: (a, b, 'default') for m, (a, b) in DEFAULTS.items()}
    measured = measure(comm) if calibrate else None
    if measured is not None:
        model_params['mpi'] = measured + ('measured',)
    if latency is not None or bandwidth is not None:
        for medium, (a, b, _) in list(model_params.items()):
            model_params[medium] = (a if latency is None else latency,
                                    b if bandwidth is None else bandwidth,
                                    'given')
    messages, how = _messages(comm, rows, on_gpu,
                              numpy.float32 if wire is None else wire)
    predicted = sum(ring_allreduce_time(n, k, *model_params[m][:2])
                    for n, k, m in messages)
    text = _format(comm, rows, uninit, on_gpu, wire, how, messages,
                   model_params, predicted, batch_size, step_time)
    if out is not None and comm.rank == 0:
        out(text)
    return text


def _format(comm, rows, uninit, on_gpu, wire, how, messages, model_params,
            predicted, batch_size, step_time):
    p = comm.size
    total = sum(r[3] for r in rows)
    lines = ['explain: {} communicator, {} rank{}, arrays on {}, transfer '
             'dtype {}'.format(comm.name, p, '' if p == 1 else 's',
                               'GPU' if on_gpu else 'CPU',
                               'each gradient\'s own' if wire is None
                               else wire),
             '{:>4}  {:<28} {:<16} {:<8} {:>12} {:>12}'.format(
                 '#', 'parameter', 'shape', 'dtype', 'bytes',
                 'offset' if comm.name != 'naive' else '')]
    for i, (name, shape, dtype, nbytes, offset) in enumerate(rows):
        lines.append('{:>4}  {:<28} {:<16} {:<8} {:>12,} {:>12}'.format(
            i, name, str(shape), dtype, nbytes,
            '' if comm.name == 'naive' else '{:,}'.format(offset)))
    if uninit:
        lines.append('not counted (uninitialized; run one forward pass): '
                     + ', '.join(uninit))
    lines.append('total: {} parameters, {:,} bytes; {}'.format(
        len(rows), total, how))
    lines.append('each rank sends and receives about 2(p-1)/p * n = {:,.0f} '
                 'bytes per step'.format(2.0 * (p - 1) / p * total))
    lines.append('alpha-beta model, ring allreduce: t = 2(p-1)/p * n / B + '
                 '2(p-1) * alpha')
    for medium in sorted({m for _, _, m in messages}):
        a, b, source = model_params[medium]
        lines.append('  {}: alpha = {:.4g} us, B = {:.4g} GB/s ({})'.format(
            medium.upper(), a * 1e6, b / 1e9, source))
    lines.append('predicted allreduce time per step: {:.4g} ms ({} message{})'
                 .format(predicted * 1e3, len(messages),
                         '' if len(messages) == 1 else 's'))
    if batch_size is not None:
        lines.append('global batch: {} per rank x {} = {}'.format(
            batch_size, p, batch_size * p))
    if step_time is not None:
        step = step_time + predicted
        lines.append('step: {:.3f} ms compute + {:.3f} ms allreduce = {:.3f} '
                     'ms without overlap; scaling efficiency {:.1%}'.format(
                         step_time * 1e3, predicted * 1e3, step * 1e3,
                         step_time / step if step > 0 else 1.0))
        if batch_size is not None and step > 0:
            lines.append('predicted throughput: {:,.1f} samples/s on {} '
                         'ranks'.format(batch_size * p / step, p))
    return '\n'.join(line.rstrip() for line in lines)
