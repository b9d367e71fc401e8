"""What the timeline's instrumentation costs while nothing records.

Run in one process, no MPI: ``python bench/timeline_cost.py``. Each
communicator step (pack, allreduce, unpack...) is wrapped in
``with timeline.span(name, nbytes):``; with the timeline off that returns
one shared object whose ``with`` does nothing. This times, on an empty
step body, taking turns batch by batch:

* ``bare``: the step alone (a call of an empty function);
* ``if rec``: the step between the two ``if rec:`` tests that the
  communicators had before spans (``rec = timeline.active`` first);
* ``span off``: the step inside ``timeline.span`` with nothing recording;
* ``span on``: the same while a timeline records (for scale: two clock
  reads and one event);

and, for scale, ``pack 4 MB``: packing one pipeline chunk of the flat
communicator (a scaled copy of 1 Mi float32). It prints nanoseconds per
step above ``bare`` (the median over repetitions) and what the spans of one
flat ResNet-50 step cost (25.6 M float32 gradients: pack and allreduce of
25 chunks, one unpack, and the optimizer's forward, backward and update).
``--quick``: fewer repetitions.
"""
import argparse
import os
import tempfile
import time
import types

import numpy

from minichain.dist.trace import timeline

SPANS_PER_RESNET50_STEP = 2 * 25 + 1 + 3


def step():
    pass


def bare():
    step()


def if_rec():
    rec = timeline.active
    if rec:
        t = rec.start()
    step()
    if rec:
        rec.stop('pack', t, 64)


def span():
    with timeline.span('pack', 64):
        step()


def timed(fns, reps, batch):
    """Median over ``reps`` of the seconds per call of each of ``fns``,
    taking turns batch by batch."""
    times = [[] for _ in fns]
    for _ in range(reps):
        for fn, ts in zip(fns, times):
            t0 = time.perf_counter()
            for _ in range(batch):
                fn()
            ts.append((time.perf_counter() - t0) / batch)
    return [float(numpy.median(ts)) for ts in times]


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--quick', action='store_true')
    args = p.parse_args()
    reps, batch = (5, 20000) if args.quick else (31, 100000)
    t_bare, t_if, t_off = timed([bare, if_rec, span], reps, batch)
    one = types.SimpleNamespace(rank=0, size=1)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, 't.json')
        with timeline.record(path, one, out=None) as rec:
            t_on, = timed([span], 3, 2000)
            rec.events.clear()
    grad = numpy.ones(1 << 20, numpy.float32)
    buf = numpy.empty_like(grad)
    t_pack, = timed([lambda: numpy.multiply(grad, 0.5, out=buf)], reps, 20)
    print('timeline instrumentation per step, nothing recording ({} '
          'repetitions; nanoseconds above a bare step of {:.0f} ns)'.format(
              reps, t_bare * 1e9))
    rows = [('if rec', t_if - t_bare), ('span off', t_off - t_bare),
            ('span on', t_on - t_bare)]
    for name, t in rows:
        print('{:<10} {:>10.0f}'.format(name, t * 1e9))
    print('span off / if rec: {:.2f} ({:+.0f} ns a step)'.format(
        (t_off - t_bare) / max(t_if - t_bare, 1e-12), (t_off - t_if) * 1e9))
    print('one flat ResNet-50 step: {} spans, {:.1f} us off against {:.1f} '
          'us before; packing one 4 MB chunk takes {:.0f} us'.format(
              SPANS_PER_RESNET50_STEP,
              SPANS_PER_RESNET50_STEP * (t_off - t_bare) * 1e6,
              SPANS_PER_RESNET50_STEP * (t_if - t_bare) * 1e6, t_pack * 1e6))


if __name__ == '__main__':
    main()
