"""Draw one step of a timeline trace as a PNG, with matplotlib.

A Chrome trace (``MINICHAIN_TIMELINE``, :mod:`minichain.dist.trace.timeline`)
needs a browser to look at; a picture of one step fits in a page or a
report. Each rank gets three lanes (compute, copy, comm, as in the trace):
forward, backward and update on the compute lane with a tick at each
gradient made final (``grad``), packing and unpacking on the copy lane,
and on the comm lane the allreduce (or, with overlap, each bucket from its
launch to the moment it was seen complete, alternately shaded, with a
triangle when its last gradient was final) and the ``wait`` for the last
buckets after backward::

    python -m minichain.dist.trace.timeline_plot trace.json step.png [--step -1]

matplotlib is an optional dependency (``pip install matplotlib``).
"""
import argparse
import json

from minichain.dist.trace.timeline import CATEGORIES

COLORS = {'forward': '#4c72b0', 'backward': '#55a868', 'update': '#8172b2',
          'pack': '#dd8452', 'unpack': '#dd8452', 'allreduce': '#c44e52',
          'bcast': '#c44e52', 'wait': '#bbbbbb'}
BUCKET_COLORS = ('#c44e52', '#e8a0a2')


def step_window(trace, step=-1):
    """``(start, end)`` in microseconds of rank 0's ``step``-th training
    step (from its forward's start to its update's end)."""
    events = [e for e in trace['traceEvents'] if e['ph'] == 'X'
              and e['pid'] == 0]
    forwards = [e for e in events if e['name'] == 'forward']
    updates = [e for e in events if e['name'] == 'update']
    if not forwards or not updates:
        raise ValueError('timeline_plot: the trace has no forward and update '
                         'of rank 0 (was it recorded around opt.update?)')
    start = forwards[step]['ts']
    ends = [u['ts'] + u['dur'] for u in updates if u['ts'] >= start]
    if not ends:
        raise ValueError('timeline_plot: step {} of rank 0 has no update'
                         .format(step))
    return start, ends[0]


def plot(trace, path, step=-1, title=None, width=11.0):
    """Write rank by rank lanes of one step of ``trace`` (a dict, as
    :func:`minichain.dist.trace.timeline.to_trace` builds it) to ``path``.

    Args:
        step: which of rank 0's steps (an index into its forwards; the
            other ranks' events in the same time window are drawn too).
    Returns:
        The matplotlib Figure.
    """
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch
    start, end = step_window(trace, step)
    margin = 0.02 * (end - start)
    lo, hi = start - margin, end + margin
    ranks = sorted({e['pid'] for e in trace['traceEvents']})
    lanes = len(CATEGORIES)
    fig = Figure(figsize=(width, 0.55 * lanes * len(ranks) + 1.2))
    ax = fig.add_subplot()
    labels, ticks = [], []
    for r in ranks:
        events = [e for e in trace['traceEvents'] if e['ph'] == 'X'
                  and e['pid'] == r and e['ts'] + e['dur'] >= lo
                  and e['ts'] <= hi]
        buckets = 0
        for e in sorted(events, key=lambda e: e['ts']):
            y = (len(ranks) - 1 - r) * (lanes + 0.6) + lanes - 1 - e['tid']
            x0, w = (e['ts'] - start) / 1e3, e['dur'] / 1e3
            if e['name'] == 'grad':
                ax.plot([x0, x0], [y + 0.05, y + 0.35], color='black',
                        linewidth=0.6)
            elif e['name'] == 'ready':
                ax.plot([x0], [y + 0.85], marker='v', color='black',
                        markersize=4)
            elif e['name'] == 'bucket':
                ax.broken_barh([(x0, w)], (y + 0.1, 0.6), edgecolor='white',
                               linewidth=0.4,
                               facecolor=BUCKET_COLORS[buckets % 2])
                buckets += 1
            else:
                ax.broken_barh([(x0, w)], (y + 0.1, 0.8), facecolor=COLORS.get(
                    e['name'], '#999999'), edgecolor='white', linewidth=0.4)
        for tid, cat in enumerate(CATEGORIES):
            ticks.append((len(ranks) - 1 - r) * (lanes + 0.6) + lanes - 1
                         - tid + 0.5)
            labels.append('rank {} {}'.format(r, cat))
    ax.set_yticks(ticks)
    ax.set_yticklabels(labels)
    ax.set_xlim((lo - start) / 1e3, (hi - start) / 1e3)
    ax.set_xlabel('ms from the start of the step (rank 0)')
    shown = {e['name'] for e in trace['traceEvents'] if e['ph'] == 'X'
             and lo <= e['ts'] <= hi}
    handles = [Patch(color=COLORS[n], label=n) for n in (
        'forward', 'backward', 'update', 'pack', 'allreduce', 'bcast',
        'wait') if n in shown]
    if 'bucket' in shown:
        handles.append(Patch(color=BUCKET_COLORS[0], label='bucket (launch '
                             'to seen complete)'))
    ax.legend(handles=handles, loc='upper center', ncol=len(handles),
              fontsize=7, bbox_to_anchor=(0.5, -0.25), frameon=False)
    ax.set_title(title or 'one step; ticks: a gradient is final; '
                 'triangles: a bucket is ready', fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return fig


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('trace', help='a trace written by minichain.dist.trace.timeline')
    p.add_argument('png')
    p.add_argument('--step', type=int, default=-1,
                   help="rank 0's step to draw (default: the last)")
    p.add_argument('--title')
    args = p.parse_args(argv)
    with open(args.trace) as f:
        trace = json.load(f)
    plot(trace, args.png, args.step, args.title)


if __name__ == '__main__':
    main()
