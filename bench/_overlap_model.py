"""The "+ overlap" part of bench/scaling_model.py: DDP's bucket pipeline
played over the measured times at which ResNet-50's gradients become final
(``bench/ready_times.py`` writes ``resnet50_ready.json``)."""
import json
import os

DDP_BUCKET_BYTES = 25 * 2 ** 20         # PyTorch DDP's default bucket_cap_mb
DDP_FIRST_BYTES = 2 ** 20               # and its first bucket's
READY_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                          'resnet50_ready.json')


def load_ready(path=READY_PATH):
    """A ``Workload.ready`` profile from ``bench/ready_times.py``'s JSON:
    each gradient's time over the backward's, in the order they became
    final, with its bytes."""
    with open(path) as f:
        prof = json.load(f)
    total = prof['backward_s']
    return tuple((min(1.0, at / total), nbytes)
                 for _, at, nbytes in prof['grads'])


def buckets(ready, bucket_bytes=DDP_BUCKET_BYTES, first_bytes=DDP_FIRST_BYTES):
    """``[(ready fraction, bytes)]`` of the buckets that ``ready`` fills, in
    order (as ``minichain.dist.averaging.overlap.plan_buckets``: a bucket closes once
    it holds its cap); each is ready when its last gradient is."""
    out, at, size = [], 0.0, 0
    for frac, nbytes in ready:
        at, size = max(at, frac), size + nbytes
        if size >= (bucket_bytes if out else first_bytes):
            out.append((at, size))
            at, size = 0.0, 0
    if size:
        out.append((at, size))
    return out


def exposed_overlapped(workload, cost, transfer_bytes=4,
                       bucket_bytes=DDP_BUCKET_BYTES,
                       first_bytes=DDP_FIRST_BYTES):
    """Seconds of communication past the end of backward when each bucket
    of ``workload.ready`` is allreduced (``cost(nbytes)`` seconds, one at a
    time, in order) as soon as it is ready and the previous one is done.
    The bucket caps are in float32 bytes."""
    backward = workload.backward_share * workload.step_s
    total = sum(b for _, b in workload.ready)
    scale = workload.grad_bytes / total * transfer_bytes / 4.0
    done = 0.0
    for frac, nbytes in buckets(workload.ready, bucket_bytes, first_bytes):
        done = max(done, frac * backward) + cost(nbytes * scale)
    return max(0.0, done - backward)
