"""Predict data-parallel ResNet-50 efficiency from 1 to 1024 GPUs, on paper.

An alpha-beta cost model: a message of ``n`` bytes over a link costs
``alpha + n / beta``. Averaging the packed gradients (ResNet-50: 25,557,032
float32 parameters, 102,228,128 bytes = 97.5 MiB) over ``p`` GPUs with a
ring allreduce (a reduce-scatter then an allgather, ``p - 1`` steps each)
costs

    T_ring(n, p) = 2 (p - 1) / p * n / beta + 2 (p - 1) * alpha

A flat ring across nodes runs at the slower of the NVLink/PCIe and network
bandwidths and pays the network latency at every one of its 2 (p - 1)
steps. The hierarchical allreduce (what NCCL and minichain's
'hierarchical' communicator do) reduce-scatters inside each node of ``g``
GPUs, allreduces each GPU's 1/g shard across the N nodes (g rings at once,
sharing the node's network links), then allgathers inside the node:

    T_hier = 2 [(g - 1) / g * n / beta_intra + (g - 1) alpha_intra]
             + 2 (N - 1) / N * n / beta_node + 2 (N - 1) alpha_inter

Weak scaling (a fixed batch per GPU): efficiency = T_step / (T_step +
exposed communication). Without overlap all of it is exposed. With overlap
(allreduce buckets launched while backward still runs, as PyTorch DDP and
Horovod do, and minichain's ``overlap=True``) the gradients are grouped in
DDP's buckets (1 MiB first, then 25 MiB) in the order they become final in
a measured backward of ResNet-50 (``bench/ready_times.py`` writes
``bench/resnet50_ready.json``: each gradient's time as a fraction of
backward). Bucket k starts when its last gradient is final and the previous
bucket is done, and costs its own allreduce (latency included); what runs
past the end of backward is exposed. Without a profile, backward hides up
to ``backward_share * T_step``, except the last 25 MiB. float16 transfer
halves ``n``.

    python bench/scaling_model.py [--markdown]
    python bench/scaling_model.py --custom --img-per-s 3000 --batch 256 \\
        --gpus-per-node 8 --intra-GBps 360 --inter-Gbps 400

Bandwidths are what collectives achieve (busbw), not line rates; each
preset states how it was derived. Sources are in bench/README.md.
"""
import argparse
import dataclasses
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _overlap_model import (DDP_BUCKET_BYTES, READY_PATH,  # noqa: E402
                            exposed_overlapped, load_ready)
from _overlap_model import buckets  # noqa: E402,F401 (for its users)

RESNET50_PARAMS = 25_557_032            # ResNet50(1000) in models/resnet.py
GRAD_BYTES = RESNET50_PARAMS * 4        # 102,228,128 B packed float32
GPU_COUNTS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
LINK_EFFICIENCY = 0.85                  # busbw / data rate, assumed


def gbit(x):
    """Gb/s to bytes/s."""
    return x * 1e9 / 8


@dataclasses.dataclass(frozen=True)
class Cluster:
    """A homogeneous GPU cluster, as achieved bandwidths and latencies.

    Attributes:
        name: for the tables.
        gpus_per_node: g.
        intra_bw: bytes/s each GPU moves per direction inside a node.
        inter_bw: bytes/s a whole node moves per direction to the network
            (all its NICs together).
        intra_alpha, inter_alpha: seconds per ring step inside a node and
            between nodes.
    """
    name: str
    gpus_per_node: int
    intra_bw: float
    inter_bw: float
    intra_alpha: float
    inter_alpha: float


@dataclasses.dataclass(frozen=True)
class Workload:
    """One GPU's training step.

    Attributes:
        step_s: compute seconds of a step on one GPU (forward, backward,
            update), without communication.
        batch: images per GPU per step.
        grad_bytes: float32 bytes of the packed gradients.
        backward_share: the part of ``step_s`` that backward takes (about
            2/3: backward costs about twice the forward).
        tail_bytes: float32 gradient bytes in the last bucket, which is
            reduced only after backward ends (without ``ready``).
        ready: None, or ``((fraction of backward, float32 bytes), ...)``:
            when each gradient is final, in that order (:func:`load_ready`).
    """
    step_s: float
    batch: int = 32
    grad_bytes: float = GRAD_BYTES
    backward_share: float = 2.0 / 3.0
    tail_bytes: float = DDP_BUCKET_BYTES
    ready: tuple = None

    def with_step(self, step_s):
        return dataclasses.replace(self, step_s=step_s)


def ring_allreduce_time(nbytes, p, bw, alpha):
    """2 (p - 1) / p * n / bw + 2 (p - 1) alpha; 0 for one GPU."""
    if p <= 1:
        return 0.0
    return 2.0 * (p - 1) / p * nbytes / bw + 2.0 * (p - 1) * alpha


def reduce_scatter_time(nbytes, p, bw, alpha):
    """(p - 1) / p * n / bw + (p - 1) alpha (an allgather costs the same)."""
    if p <= 1:
        return 0.0
    return (p - 1.0) / p * nbytes / bw + (p - 1.0) * alpha


def layout(p, cluster):
    """(GPUs per node used, nodes) for ``p`` GPUs, filling nodes first."""
    g = cluster.gpus_per_node
    if p <= g:
        return p, 1
    if p % g:
        raise ValueError('scaling_model: {} GPUs do not fill nodes of {}'
                         .format(p, g))
    return g, p // g


def allreduce_time(nbytes, p, cluster, algorithm):
    """Seconds to allreduce ``nbytes`` over ``p`` GPUs.

    Args:
        algorithm: 'ring' (one flat ring over every GPU) or 'hier'
            (reduce-scatter in the node, ring across nodes, allgather).
    """
    if algorithm not in ('ring', 'hier'):
        raise ValueError('scaling_model: unknown algorithm {!r}'
                         .format(algorithm))
    g, nodes = layout(p, cluster)
    if nodes == 1:
        return ring_allreduce_time(nbytes, g, cluster.intra_bw,
                                   cluster.intra_alpha)
    if algorithm == 'ring':
        return ring_allreduce_time(nbytes, p, min(cluster.intra_bw,
                                                  cluster.inter_bw),
                                   max(cluster.intra_alpha,
                                       cluster.inter_alpha))
    # g concurrent rings of n/g bytes share the node's links: the same time
    # as one ring of n bytes at the node's bandwidth.
    return (2 * reduce_scatter_time(nbytes, g, cluster.intra_bw,
                                    cluster.intra_alpha)
            + ring_allreduce_time(nbytes, nodes, cluster.inter_bw,
                                  cluster.inter_alpha))


def exposed_time(comm_s, workload, overlap):
    """The communication seconds that the step waits for, without a
    ready profile."""
    if not overlap:
        return comm_s
    tail = comm_s * min(1.0, workload.tail_bytes / workload.grad_bytes)
    return max(comm_s - workload.backward_share * workload.step_s, tail)


def efficiency(p, cluster, workload, algorithm='ring', overlap=False,
               transfer_bytes=4):
    """Weak-scaling efficiency: throughput(p) / (p * throughput(1)).

    Args:
        transfer_bytes: bytes per gradient element on the wire (4 for
            float32, 2 for float16).
    """
    if overlap and workload.ready is not None and p > 1:
        exposed = exposed_overlapped(workload, lambda n: allreduce_time(
            n, p, cluster, algorithm), transfer_bytes)
    else:
        nbytes = workload.grad_bytes * transfer_bytes / 4.0
        comm = allreduce_time(nbytes, p, cluster, algorithm)
        exposed = exposed_time(comm, workload, overlap)
    return workload.step_s / (workload.step_s + exposed)


# (column title, algorithm, overlap, bytes per element on the wire)
VARIANTS = (
    ('ring', 'ring', False, 4),
    ('ring+ovl', 'ring', True, 4),
    ('hier', 'hier', False, 4),
    ('hier+ovl', 'hier', True, 4),
    ('hier fp16', 'hier', False, 2),
    ('hier+ovl fp16', 'hier', True, 2),
)


def _bisect(f, lo, hi, target, iters=200):
    """x in [lo, hi] (log scale) with increasing f(x) == target, or None."""
    if not f(lo) <= target <= f(hi):
        return None
    for _ in range(iters):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if f(mid) < target else (lo, mid)
    return math.sqrt(lo * hi)


def calibrate_step(target, p, cluster, workload, **variant):
    """The compute seconds per step that make ``efficiency(p)`` equal
    ``target`` (efficiency grows with the step time); None if none does."""
    return _bisect(lambda s: efficiency(p, cluster, workload.with_step(s),
                                        **variant), 1e-6, 1e4, target)


def calibrate_inter_bw(target, p, cluster, workload, **variant):
    """The node network bandwidth (bytes/s) that makes ``efficiency(p)``
    equal ``target``; None when latency alone already exceeds the budget."""
    def eff(bw):
        return efficiency(p, dataclasses.replace(cluster, inter_bw=bw),
                          workload, **variant)
    return _bisect(eff, 1e6, 1e15, target)


if os.path.exists(READY_PATH):
    READY = load_ready()
    READY_NOTE = ('+ovl columns: DDP buckets over the gradients as they became '
                  'final in a measured backward ({})'.format(
                      os.path.relpath(READY_PATH)))
else:  # run bench/ready_times.py to make it
    READY = None
    READY_NOTE = ('+ovl columns: no {}: backward assumed to hide all but the '
                  'last 25 MiB'.format(READY_PATH))


# --- presets -------------------------------------------------------------
# InfiniBand FDR 4X: 4 lanes x 14.0625 Gb/s, 64b/66b coding -> 54.5 Gb/s.
PAPER = Cluster('2017: 4 GPUs/node on PCIe 3.0, InfiniBand FDR 4X (56 Gb/s)',
                4, 10e9, LINK_EFFICIENCY * gbit(4 * 14.0625 * 64 / 66),
                5e-6, 10e-6)
PAPER_BATCH, PAPER_GPUS, PAPER_EFFICIENCY = 32, 128, 0.90
TITANX_IMG_S = 110.0      # Maxwell GTX TITAN X, ResNet-50 training (MXNet)
P100_IMG_S = 1.5 * TITANX_IMG_S   # Pascal: 1.47-1.60x Maxwell TITAN X


def modern(gbps, nics=1):
    """An H100-class node: 8 GPUs on NVLink 4 (450 GB/s per direction,
    360 GB/s achieved) and ``nics`` links of ``gbps`` Gb/s."""
    label = '{}x{}'.format(nics, gbps) if nics > 1 else str(gbps)
    return Cluster('8 GPUs/node on NVLink, {} Gb/s per node'.format(label),
                   8, 360e9, LINK_EFFICIENCY * gbit(gbps * nics), 2e-6, 5e-6)


H100_IMG_S = 3000.0       # assumed: ResNet-50, bf16 mixed precision


def table(cluster, workload, counts=GPU_COUNTS, markdown=False):
    """Rows of efficiencies (in %) for each variant, as text lines."""
    heads = ['GPUs'] + [v[0] for v in VARIANTS]
    rows = []
    for p in counts:
        effs = [efficiency(p, cluster, workload, algorithm=a, overlap=o,
                           transfer_bytes=b) for _, a, o, b in VARIANTS]
        rows.append([str(p)] + ['{:.1f}'.format(100 * e) for e in effs])
    return _format(heads, rows, markdown)


def _format(heads, rows, markdown):
    if markdown:
        lines = ['| ' + ' | '.join(heads) + ' |',
                 '|' + '---:|' * len(heads)]
        return lines + ['| ' + ' | '.join(r) + ' |' for r in rows]
    widths = [max(len(h), 6) for h in heads]
    fmt = '  '.join('{:>%d}' % w for w in widths)
    return [fmt.format(*heads)] + [fmt.format(*r) for r in rows]


def describe(cluster, workload):
    return ('{}; {} images/GPU, compute {:.1f} ms/step ({:.0f} img/s/GPU); '
            'intra {:.0f} GB/s, network {:.1f} GB/s per node, alpha {:.0f}/'
            '{:.0f} us'.format(cluster.name, workload.batch,
                               1e3 * workload.step_s,
                               workload.batch / workload.step_s,
                               cluster.intra_bw / 1e9, cluster.inter_bw / 1e9,
                               cluster.intra_alpha * 1e6,
                               cluster.inter_alpha * 1e6))


def summary(markdown=False, counts=(128, 1024)):
    """One line per (network, batch per GPU) for the modern presets."""
    picks = [v for v in VARIANTS if v[0] in ('ring', 'hier', 'hier+ovl',
                                               'hier+ovl fp16')]
    heads = ['network per node', 'img/GPU'] + [
        '{} @{}'.format(v[0], p) for p in counts for v in picks]
    rows = []
    for gbps, nics in ((200, 1), (400, 1), (400, 8)):
        for batch in (32, 256):
            cluster = modern(gbps, nics)
            work = Workload(batch / H100_IMG_S, batch=batch, ready=READY)
            rows.append(['{}x{} Gb/s'.format(nics, gbps), str(batch)] + [
                '{:.1f}'.format(100 * efficiency(
                    p, cluster, work, algorithm=a, overlap=o,
                    transfer_bytes=b)) for p in counts for _, a, o, b in picks])
    return _format(heads, rows, markdown)


def paper_report():
    """Calibration lines and the calibrated workload for the 2017 setting."""
    ring = dict(algorithm='ring', overlap=False, transfer_bytes=4)
    base = Workload(step_s=PAPER_BATCH / TITANX_IMG_S, batch=PAPER_BATCH)
    step = calibrate_step(PAPER_EFFICIENCY, PAPER_GPUS, PAPER, base, **ring)
    cal = base.with_step(step)
    p100 = base.with_step(PAPER_BATCH / P100_IMG_S)
    comm = allreduce_time(GRAD_BYTES, PAPER_GPUS, PAPER, 'ring')
    lines = [
        'Paper setting: ResNet-50, {} images/GPU, 4 GPUs/node, InfiniBand '
        'FDR; float32 ring allreduce after backward (no overlap)'
        .format(PAPER_BATCH),
        '  allreduce of {:,} B over {} GPUs: {:.1f} ms'
        .format(GRAD_BYTES, PAPER_GPUS, 1e3 * comm),
        '  paper (ChainerMN, Akiba et al. 2017): {:.0f}% at {} GPUs'
        .format(100 * PAPER_EFFICIENCY, PAPER_GPUS),
        '  model, TITAN X (Maxwell) speed, {:.0f} img/s/GPU: {:.1f}%'
        .format(TITANX_IMG_S, 100 * efficiency(PAPER_GPUS, PAPER, base,
                                               **ring)),
        '  model, P100 speed (~{:.0f} img/s/GPU):            {:.1f}%'
        .format(P100_IMG_S, 100 * efficiency(PAPER_GPUS, PAPER, p100,
                                             **ring)),
        '  calibrated: 90% needs {:.0f} ms of compute per step ({:.0f} '
        'img/s/GPU)'.format(1e3 * step, PAPER_BATCH / step),
    ]
    for name in ('ring', 'hier'):
        need = calibrate_inter_bw(PAPER_EFFICIENCY, PAPER_GPUS, PAPER, p100,
                                  **dict(ring, algorithm=name))
        lines.append('  at P100 speed, 90% with {} needs '.format(name) + (
            'more than any network gives (the in-node links alone cost too '
            'much)' if need is None else '{:.1f} GB/s per node ({:.1f}x the '
            'FDR link assumed)'.format(need / 1e9, need / PAPER.inter_bw)))
    return lines, cal


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--markdown', action='store_true',
                   help='print the tables as Markdown')
    p.add_argument('--custom', action='store_true',
                   help='one table for the cluster given by the options below')
    p.add_argument('--img-per-s', type=float, default=H100_IMG_S,
                   help='one GPU alone, images per second')
    p.add_argument('--batch', type=int, default=32)
    p.add_argument('--gpus-per-node', type=int, default=8)
    p.add_argument('--intra-GBps', type=float, default=360.0)
    p.add_argument('--inter-Gbps', type=float, default=400.0,
                   help='achieved network bandwidth per node')
    p.add_argument('--alpha-intra-us', type=float, default=2.0)
    p.add_argument('--alpha-inter-us', type=float, default=5.0)
    args = p.parse_args(argv)
    md = args.markdown
    print(READY_NOTE)
    print('ResNet-50 gradients: {:,} parameters = {:,} B float32 ({:.1f} '
          'MiB, {:.1f} MB)'.format(RESNET50_PARAMS, GRAD_BYTES,
                                   GRAD_BYTES / 2 ** 20, GRAD_BYTES / 1e6))
    if args.custom:
        cluster = Cluster('custom', args.gpus_per_node, args.intra_GBps * 1e9,
                          gbit(args.inter_Gbps), args.alpha_intra_us * 1e-6,
                          args.alpha_inter_us * 1e-6)
        work = Workload(args.batch / args.img_per_s, batch=args.batch,
                        ready=READY)
        counts = [n for n in GPU_COUNTS
                  if n <= args.gpus_per_node or n % args.gpus_per_node == 0]
        print('\n' + describe(cluster, work))
        print('\n'.join(table(cluster, work, counts, md)))
        return
    lines, cal = paper_report()
    print('\n' + '\n'.join(lines))
    cal = dataclasses.replace(cal, ready=READY)
    print('\nEfficiency (%), ' + describe(PAPER, cal))
    print('\n'.join(table(PAPER, cal, markdown=md)))
    for cluster in (modern(200), modern(400)):
        work = Workload(PAPER_BATCH / H100_IMG_S, batch=PAPER_BATCH,
                        ready=READY)
        print('\nEfficiency (%), ' + describe(cluster, work))
        print('\n'.join(table(cluster, work, markdown=md)))
    print('\nModern nodes at 128 and 1024 GPUs, efficiency (%), H100-class '
          'compute at {:.0f} img/s/GPU'.format(H100_IMG_S))
    print('\n'.join(summary(md)))

if __name__ == '__main__':
    main()
