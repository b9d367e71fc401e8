"""Overlapped gradient averaging: buckets allreduced while backward runs.

Without overlap a data-parallel step computes every gradient, then averages
them all (pack, one allreduce, unpack). But backward produces gradients from
the last layer to the first, and each is final long before backward ends:
the tape says when (:meth:`minichain.Link.register_grad_hook`). So, as
PyTorch DDP and Horovod do, the parameters are grouped into *buckets* of
about ``bucket_mb`` MiB in the order their gradients become final, and each
bucket is averaged (a non-blocking allreduce) the moment its last gradient
is ready, while backward goes on with the layers below. The update waits
for every bucket; only what is launched last is left after backward.

**The order.** The first averaging records the order in which the hooks
fired on rank 0 and broadcasts it; the buckets follow it from then on, the
same on every rank, and are launched strictly in that order, so that every
rank posts the same collectives in the same order whatever the timing. The
first bucket is small (``first_bucket_mb``): it holds the gradients ready
first and starts the pipeline early, as DDP's does. That first averaging
itself launches everything after backward.

**The bucket size** trades latency against overlap. Each allreduce pays a
fixed latency, so many small buckets cost more in all; but a bucket starts
only when its last gradient is ready, so big buckets start late, and the
last one (the first layers' gradients, final when backward ends) is always
exposed.

**Safety**, per step, on a Wire of the communicator's own for buckets (so
that they never mix with other collectives made during backward, such as
synchronized batch normalization's): one header when the first hook fires
(the parameter layout, the bucket plan, the settings, the training step: a
mismatch raises on every rank before any bucket is sent), then the buckets,
then one small allreduce counting the ranks that had each gradient (one that
no rank had stays None, as without overlap; one missing on some ranks only
counts as zeros, or raises with ``zero_fill=False``). Every wait goes
through the Wire, so stalls, mismatches and signals are handled as in any
collective. A header per bucket would buy nothing: the plan is fixed for
the step, and each header is a round trip that would stall backward.

**Progress.** MPICH moves a non-blocking collective on only inside MPI
calls, so the buckets in flight are tested after every function of
backward (the tape's ``between`` callback), not only when a gradient is
final, so that the gap between two tests is one function, however long
backward goes without finishing a gradient (a test costs microseconds).
On the loaded 2-core machine, testing in the hooks only was not measurably
different; MPICH's progress thread was clearly slower (``bench/scaling.py
--overlap --progress nodes,poll,async``, bench/README.md). On the GPU, NCCL reduces the buckets on a side stream
that waits for the compute stream with an event
(:mod:`minichain.dist.nccl_buckets`).
"""
import zlib

import numpy

from minichain import backend
from minichain.dist import hooks, mpi, packing
from minichain.dist.averaging.after_backward import AfterBackward
from minichain.dist.failures import partial_grads_error

MIB = 1 << 20
BUCKET_MB = 25.0          # PyTorch DDP's bucket_cap_mb
FIRST_BUCKET_MB = 1.0     # and its first bucket's


def plan_buckets(nbytes, bucket_bytes, first_bytes):
    """Group consecutive items of sizes ``nbytes`` into buckets; a bucket
    closes once it holds at least its cap (``first_bytes`` for the first,
    ``bucket_bytes`` after), so an item larger than the cap is a bucket of
    its own. Returns lists of indexes, in order."""
    buckets, current, total = [], [], 0
    for i, n in enumerate(nbytes):
        current.append(i)
        total += n
        if total >= (bucket_bytes if buckets else first_bytes):
            buckets.append(current)
            current, total = [], 0
    if current:
        buckets.append(current)
    return buckets


class Overlapped(AfterBackward):
    """The averaging with ``overlap=True``: a :class:`Reducer` on the model
    sends buckets during the final backward pass of each step, and
    ``average`` waits for the rest. Inside ``join`` it averages after
    backward, as :class:`AfterBackward` (ranks without data have no
    backward to hook).

    Args:
        comm, zero_fill, step_count, passes: as for :class:`AfterBackward`.
        bucket_mb: the buckets' size in MiB (None: 25).
    """

    def __init__(self, comm, zero_fill=True, step_count=None, passes=1,
                 bucket_mb=None):
        super().__init__(comm, zero_fill, step_count, passes)
        self.bucket_mb = bucket_mb

    def setup(self, model):
        if self.reducer is not None:
            self.reducer.close()
        self.reducer = Reducer(self.comm, model, self.step_count,
                               bucket_mb=self.bucket_mb,
                               accumulate=self.passes)

    def prepare(self, final=True):
        self.reducer.armed = final

    def average(self, model, has_data=None):
        if has_data is not None:
            return super().average(model, has_data)
        self.reducer.finish(self.zero_fill)  # divides by ranks and passes
        return True

    def discard(self):
        if self.reducer.step is not None:
            self.reducer.finish()  # buckets sent during that backward


class Bucket:
    """Parameters whose gradients are reduced together, in one buffer.

    Attributes:
        entries: ``[(path, param)]`` in launch order.
        start: index of the first entry in the plan's order.
        buf: the buffer the averaged gradients are read from.
        nbytes: bytes on the wire.
        packer: this step's :class:`~minichain.dist.packing.Packer` (it
            holds the gradients until the bucket is done).
        work: the transport's handles while in flight.
    """

    def __init__(self, entries, start, buf, itemsize):
        self.entries, self.start, self.buf = entries, start, buf
        self.size = sum(p.size for _, p in entries)
        self.nbytes = self.size * itemsize
        self.packer = self.work = self.host = None
        self.span = hooks.NO_SPAN

    def describe(self):
        """The bucket as a layout entry the ranks must agree on."""
        names = '\n'.join(n for n, _ in self.entries).encode()
        return '{} params, {} elements, paths {:08x}'.format(
            len(self.entries), self.size, zlib.crc32(names))


class _Step:
    """One averaging in progress: which gradients are ready, which buckets
    are launched."""

    def __init__(self, plan):
        self.remaining = [len(b.entries) for b in plan.buckets]
        self.ready = set()
        self.next = 0                  # the next bucket to launch
        self.in_flight = []
        self.missing = numpy.zeros(len(plan.entries), bool)  # this rank's
        self.has = numpy.zeros(len(plan.entries), numpy.int64)
        self.presence = None           # the request summing ``has``
        self.during_backward = 0       # buckets launched by hooks


class Plan:
    """The buckets of one parameter layout, in launch order."""

    def __init__(self, layout, entries, buckets):
        self.layout, self.entries, self.buckets = layout, entries, buckets
        self._description = None
        self.bucket_of = {}
        for k, b in enumerate(buckets):
            for _, p in b.entries:
                self.bucket_of[id(p)] = k

    def describe(self):
        """The buckets as layout entries (made once: the plan is fixed,
        and the header of every step carries them)."""
        if self._description is None:
            self._description = [('(bucket {})'.format(k), 'tag',
                                  b.describe())
                                 for k, b in enumerate(self.buckets)]
        return self._description


class Reducer:
    """Averages one model's gradients in buckets while backward runs.

    Made by :meth:`Overlapped.setup` (``create_multi_node_optimizer(...,
    overlap=True)``); it hooks every parameter of ``model`` at once (no
    communication) and averages at :meth:`finish`, which the optimizer's
    update calls through :meth:`Overlapped.average`. Collective: every rank runs the same backward passes and
    calls ``finish`` together.

    Args:
        comm: a flat, pure_nccl or hierarchical communicator.
        model: the Link whose gradients are averaged.
        step_count: returns the optimizer's update count (compared between
            ranks in each header).
        bucket_mb, first_bucket_mb: bucket caps in MiB (None: 25 and 1).
        accumulate: backward passes per update; the hooks act only in the
            last one (``armed``), and the gradients are divided by it too.
    Attributes:
        armed: whether the hooks launch buckets in the next backward.
        plan: the :class:`Plan`, after the first averaging.
        launched_in_backward: how many buckets of the last averaging were
            launched by the hooks, while backward still ran.
        poll_between_nodes: test the buckets in flight after every
            function of backward too, not only in the hooks (class default
            True; bench/scaling.py turns it off to compare).
    """

    poll_between_nodes = True

    def __init__(self, comm, model, step_count, bucket_mb=None,
                 first_bucket_mb=None, accumulate=1):
        mb = BUCKET_MB if bucket_mb is None else bucket_mb
        first = FIRST_BUCKET_MB if first_bucket_mb is None else first_bucket_mb
        if not (mb > 0 and first > 0):
            raise ValueError('overlap: bucket_mb and first_bucket_mb must be '
                             'positive, got {} and {}'.format(mb, first))
        self.comm, self.model, self._step_count = comm, model, step_count
        self.bucket_bytes = max(1, int(mb * MIB))
        self.first_bytes = max(1, min(self.bucket_bytes, int(first * MIB)))
        self.accumulate = accumulate
        self.scale = 1.0 / (comm.size * accumulate)
        self.armed = accumulate == 1
        self.plan = self.transport = self.step = None
        self.launched_in_backward = 0
        self._deferred = False   # this step was found unplanned: finish it
        self._fired, self._order = [], []
        self._hook(model)

    def _hook(self, model):
        self._handle = model.register_grad_hook(
            self._on_ready, self._on_backward_end, self._between)
        self._hooked = {id(p) for _, p in model.namedparams()}

    def close(self):
        """Unhook the model."""
        self._handle.remove()
        self._hooked = set()

    # -- during backward ------------------------------------------------------
    def _on_ready(self, param):
        self._fired.append(param)
        if not self.armed:
            return
        hooks.mark('grad', param.grad.nbytes)
        step = self.step or self._begin()
        if step is None:
            return
        k = self.plan.bucket_of.get(id(param))
        if id(param) in step.ready:
            raise RuntimeError(
                'overlap: the gradient of a parameter became final twice '
                'before update (two backward passes in one step?); its '
                'bucket was already sent. For several backward passes per '
                'update use accumulate=k')
        step.ready.add(id(param))
        step.remaining[k] -= 1
        if step.remaining[k] == 0:
            hooks.mark('ready', self.plan.buckets[k].nbytes)
        step.during_backward += self._launch_ready(step)
        self._poll(step)

    def _between(self):
        step = self.step
        if step is not None and step.in_flight and self.poll_between_nodes:
            self._poll(step)

    def _on_backward_end(self, missing):
        self._order, self._fired = self._fired, []
        if self.step is not None:  # the rest is final now (no gradient)
            self._launch_rest(self.step)

    def _begin(self):
        """At the first hook of a step: open it (the header) if a plan for
        this layout exists; else leave the whole step to finish."""
        if self.plan is None or self._deferred:
            return None
        layout = packing.param_layout(self.model.namedparams())
        if layout != self.plan.layout:  # the model changed: plan again
            self._deferred = True
            return None
        return self._open(layout)

    def _open(self, layout):
        wire = self.comm.bucket_wire()
        wire.collective('multi_node_mean_grad')
        try:
            replan = self.plan is None or layout != self.plan.layout
            plan_entries = ([('(buckets)', 'tag', 'planned now')] if replan
                            else self.plan.describe())
            self.comm.agree_layout(wire, layout + list(self.comm.layout_extra(
                self.model)) + self._settings() + plan_entries,
                'multi_node_mean_grad', step=self._step_count())
            if replan:
                self._make_plan(wire, layout)
        except BaseException:
            wire.close()
            raise
        self.step = _Step(self.plan)
        return self.step

    def _settings(self):
        dtype = self.comm.allreduce_grad_dtype
        return [('(overlap)', 'tag', 'buckets of {} B, first {} B, '
                 'accumulate {}, transfer {}'.format(
                     self.bucket_bytes, self.first_bytes, self.accumulate,
                     'as the gradients' if dtype is None else dtype))]

    def _make_plan(self, wire, layout):
        entries = [(n, p) for n, p in self.model.namedparams()
                   if p.array is not None]
        index = {id(p): i for i, (_, p) in enumerate(entries)}
        fired = list(dict.fromkeys(index[id(p)] for p in self._order
                                   if id(p) in index))
        seen = set(fired)
        rest = [i for i in reversed(range(len(entries))) if i not in seen]
        order = numpy.array(fired + rest, numpy.int64)
        wire.Bcast(order, root=0)  # rank 0's order, on every rank
        ordered = [entries[i] for i in order]
        if self.transport is None and ordered:
            self.transport = self.comm.bucket_transport(
                backend.get_device_id(ordered[0][1].array))
        buckets = []
        if ordered:
            dtype, itemsize = self.transport.dtypes(ordered)
            groups = plan_buckets([p.size * itemsize for _, p in ordered],
                                  self.bucket_bytes, self.first_bytes)
            for g in groups:
                part = [ordered[i] for i in g]
                buckets.append(Bucket(part, g[0], self.transport.empty(
                    sum(p.size for _, p in part), dtype), itemsize))
        self.plan = Plan(layout, ordered, buckets)
        if any(id(p) not in self._hooked for _, p in ordered):
            self.close()  # parameters were added: hook them too
            self._hook(self.model)

    # -- buckets --------------------------------------------------------------
    def _launch_ready(self, step):
        """Launch, in order, the buckets whose gradients are all final;
        returns how many."""
        launched = 0
        while (step.next < len(self.plan.buckets)
               and step.remaining[step.next] == 0):
            self._launch(step, self.plan.buckets[step.next])
            step.next += 1
            launched += 1
        if step.next == len(self.plan.buckets) and step.presence is None:
            MPI = mpi.import_mpi()
            step.presence = self.comm.bucket_wire().Iallreduce(
                MPI.IN_PLACE, step.has, op=MPI.SUM)
        return launched

    def _launch(self, step, bucket):
        grads = [(n, p, p.grad) for n, p in bucket.entries]
        here = slice(bucket.start, bucket.start + len(grads))
        step.missing[here] = [g is None for _, _, g in grads]
        step.has[here] = ~step.missing[here]
        bucket.packer = packing.Packer(grads)
        self.transport.start(bucket, self.scale)
        bucket.span = hooks.span('bucket', bucket.nbytes).start()
        step.in_flight.append(bucket)

    def _launch_rest(self, step):
        for k, n in enumerate(step.remaining):
            if n:
                step.remaining[k] = 0
                hooks.mark('ready', self.plan.buckets[k].nbytes)
        self._launch_ready(step)

    def _poll(self, step):
        """Let the buckets in flight progress; note those seen done."""
        while step.in_flight and self.transport.test(step.in_flight[0]):
            step.in_flight.pop(0).span.stop()

    # -- after backward -------------------------------------------------------
    def finish(self, zero_fill=True):
        """Launch what is left, wait for every bucket and set each
        ``param.grad`` to its average (a view of its bucket's buffer, reused
        at the next step). Collective.

        Raises:
            ModelMismatchError, CollectiveMismatchError: from the header
                (the layouts, bucket plans or steps differ), on every rank.
            ValueError: with ``zero_fill=False``, a gradient that some
                ranks only had (on every rank).
        """
        step = self.step
        if step is None:
            step = self._open(packing.param_layout(self.model.namedparams()))
        wire = self.comm.bucket_wire()
        try:
            self._launch_rest(step)
            with hooks.span('wait'):
                for bucket in self.plan.buckets:
                    self.transport.complete(bucket)
                    if bucket in step.in_flight:
                        bucket.span.stop()
                self.transport.check(self.plan.buckets)
                wire.wait(step.presence)
            error = self._set_grads(step, zero_fill, wire)
        finally:
            self.step, self._deferred = None, False
            self.launched_in_backward = step.during_backward
            wire.close()
        if error is not None:
            raise error

    def _set_grads(self, step, zero_fill, wire):
        with hooks.span('unpack', sum(b.nbytes for b in self.plan.buckets)):
            for bucket in self.plan.buckets:
                bucket.packer.unpack(bucket.buf)
                bucket.packer = None
        nowhere = step.has == 0
        for (_, p), none in zip(self.plan.entries, nowhere):
            if none:
                p.grad = None
        partial = ~nowhere & (step.has < self.comm.size)
        if zero_fill or not partial.any():
            return None
        return partial_grads_error(
            wire, [n for n, _ in self.plan.entries], step.missing, partial)
