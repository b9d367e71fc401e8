"""Sharded: each rank keeps and updates 1/N of the optimizer state
(``shard_state=True``; ZeRO stage 1, PyTorch's ``ZeroRedundancyOptimizer``).

The plain averaging runs one allreduce, then every rank applies the same
update to every parameter, so every rank holds the whole optimizer state
(MomentumSGD's velocity: one more copy of the model; Adam's moments: two).
An allreduce is a reduce-scatter followed by an allgather (the ring
communicator writes the two out), and the update can go *between* them::

    pack the gradients (times 1/N)        one buffer of P elements
    reduce_scatter                        rank r: the sum of its shard only
    step the shard                        state for P/N elements
    allgather_shards of the parameters    every rank: every parameter

The packed buffer is cut as the ring cuts it: ``N`` contiguous shards whose
sizes differ by at most one element (``comm.shard_bounds``), whatever the
parameter boundaries (aligning shards to parameters would be simpler, but
one large layer, e.g. a classifier, would make the shards very unequal).
A parameter that straddles two shards is stepped in two pieces, by two
ranks: each :class:`Piece` is a view of its parameter's elements, with an
update rule of its own whose state has the piece's length. That is exact
for rules that act element by element (SGD, MomentumSGD, Adam, RMSprop:
Adam's bias correction reads only the step count); a rule that looks at a
whole parameter (its norm, as LARS does) is refused at ``setup``.

While the shard is stepped, the optimizer's target is a :class:`ShardTarget`
of this rank's pieces, so the optimizer's hooks see them too: weight decay
is elementwise, and ``GradientClipping`` sums its squared norm over the
ranks (``ShardTarget.sum_over_shards``, one small allreduce).
Memory: one packed buffer (gradients, then parameters), as the flat
communicator's; the parameters' own gradients are released once packed
(``param.grad`` is None after an update: no rank holds the whole mean).
Snapshots: :meth:`Sharded.gathered_state` lets every rank's rules
hold the whole state in the unsharded format, so a snapshot resumes on any
number of ranks (and without sharding). A parameter added or removed after
setup moves the shards: the state is gathered the same way, then cut again
(each parameter keeps its state and ``t``, as in one process).
"""
import contextlib

import numpy

from minichain.optimizer import Hyperparameter
from minichain.serializers.base import Deserializer
from minichain.dist import hooks
from minichain.dist.averaging.base import Averaging
from minichain.dist.packing import BufferCache, Packer


class Piece:
    """The elements ``[a, b)`` of parameter ``param`` (flattened), stepped
    like a parameter: ``array`` a view of them, ``grad`` their summed
    gradient (None: no rank had one), ``update_rule`` their own rule."""

    def __init__(self, name, param, a, b, update_rule):
        self.name, self.param, self.a, self.b = name, param, a, b
        self.update_rule = update_rule
        self.array = self.grad = None
        self.view()

    def view(self):
        """(Re)take ``array`` as a view of the parameter's elements, so
        that the rule writes into the parameter."""
        if not self.param.array.flags.c_contiguous:  # reshape would copy
            raise ValueError(
                'shard_state: parameter {} of shape {} is not C-contiguous, '
                'so a piece of it cannot be updated in place'.format(
                    self.name, self.param.shape))
        self.array = self.param.array.reshape(-1)[self.a:self.b]


class ShardTarget:
    """What the optimizer steps while a sharded state is stepped: this
    rank's pieces, as a link's parameters."""

    def __init__(self, pieces, comm):
        self.pieces, self.comm = pieces, comm

    def params(self, include_uninit=True):
        return iter(self.pieces)

    def namedparams(self, include_uninit=True):
        return ((p.name, p) for p in self.pieces)

    def sum_over_shards(self, value):
        """The sum over ranks of a scalar each rank computed on its shard
        (GradientClipping's squared norm). Collective."""
        total = self.comm.allreduce(numpy.array([float(value)]), 'sum')
        return float(total[0])


class Sharded(Averaging):
    """Reduce-scatter, step this rank's shard, allgather the parameters.

    Args:
        comm: a communicator with ``shard_bounds``, ``reduce_scatter`` and
            ``allgather_shards`` (the MPI ones, the ring, pure_nccl).
        optimizer: the wrapped optimizer (its rules make the pieces').
        zero_fill: a gradient that is None on some ranks only counts as
            zeros there.
    """

    can_join = False
    whole_mean = False  # each rank holds its shard's sum

    def __init__(self, comm, optimizer, zero_fill=True):
        self.comm, self.optimizer, self.zero_fill = comm, optimizer, zero_fill
        self.pieces, self.layout = [], None
        self.packer = None  # every initialized parameter, in path order
        self.buffers = BufferCache()

    def setup(self, model):
        rule = self.optimizer.create_update_rule()
        if not getattr(rule, 'elementwise', False):
            raise ValueError(
                'create_multi_node_optimizer(shard_state=True): {} does not '
                'update element by element (elementwise = False), so a '
                'parameter split between two ranks\' shards cannot be '
                'updated in pieces; use shard_state=False'.format(
                    type(rule).__name__))
        self.pieces, self.layout = [], None

    def average(self, model, has_data=None):
        # The header: every rank agrees on the layout and the missing
        # gradients first (as a collective of its own).
        with self.comm.collective('multi_node_mean_grad'):
            entries, _ = self.comm.plan_grads(model, self.zero_fill)
        self._build(model)
        with_grad = {name for name, _, _ in entries}
        grads = [(n, p, p.grad if n in with_grad else None)
                 for n, p, _ in self.packer.entries]
        dtype = numpy.result_type(*[p.dtype for _, p, _ in grads])
        buf = self.buffers.get(model, 'packed', self._like(), dtype,
                               self.packer.total)
        Packer(grads).pack(buf, 1.0 / self.comm.size)
        for _, p, _ in grads:  # packed: no need to hold them twice
            p.grad = None
        self.comm.reduce_scatter(buf)
        for piece in self.pieces:
            start = self.packer.offsets[self.index[piece.name]]
            grad = buf[start + piece.a:start + piece.b]
            piece.grad = (grad.astype(piece.param.dtype, copy=False)
                          if piece.name in with_grad else None)
            piece.update_rule.enabled = piece.param.update_rule.enabled
            piece.view()  # the parameter may hold a new array
        return True

    def step(self, optimizer, *args, **kwds):
        if getattr(optimizer, 'dynamic_loss_scaling', False):
            # Each rank would see inf or NaN in its own shard only, and
            # skip alone: refused on every rank alike.
            raise ValueError('multi-node optimizer: dynamic loss scaling '
                             'cannot be combined with shard_state')
        target = optimizer.target
        optimizer.target = ShardTarget(self.pieces, self.comm)
        try:
            with hooks.span('update', sync=target.device_id >= 0):
                optimizer.update(None, *args, **kwds)
        finally:
            optimizer.target = target

    def stepped(self, model):
        """Every rank's stepped shard to every rank (the parameters)."""
        # the gradients' buffer again: its shard was stepped, the rest is
        # overwritten by the other ranks' shards
        buf = self._packed_params(model, 'packed',
                                  lambda piece: piece.array)
        self.comm.allgather_shards(buf)
        for (_, p, _), o in zip(self.packer.entries, self.packer.offsets):
            p.array[...] = buf[o:o + p.size].reshape(p.shape)

    def averaged_grads(self, model):
        return [piece.grad for piece in self.pieces if piece.grad is not None]

    def agree_finite(self, finite):
        # a non-finite value lands in one rank's shard only
        flag = numpy.array([int(finite)], numpy.int64)
        return bool(self.comm.allreduce(flag, 'min')[0])

    # -- the pieces -----------------------------------------------------------
    def _build(self, model):
        """Cut this rank's shard into pieces, once per parameter layout; a
        rule loaded into a parameter (a resumed snapshot) gives each piece
        its part of the state."""
        named = [(n, p) for n, p in model.namedparams() if p.array is not None]
        layout = [(n, p.shape) for n, p in named]
        if layout == self.layout:
            return
        if self.layout is not None:
            # A parameter was added or removed (on every rank: the header
            # agreed on the layout). The shards move, so the old pieces'
            # state goes back to the parameters' rules first; the new
            # pieces take their part of it, and a removed parameter keeps
            # its whole state, as its rule does in one process.
            self._gather(model)
        for name, param in named:
            if param.update_rule is None:  # added after setup, as update does
                param.update_rule = self.optimizer.create_update_rule()
            for key, value in (param.update_rule.state or {}).items():
                if value.shape != param.shape:  # the same on every rank
                    raise ValueError(
                        'create_multi_node_optimizer(shard_state=True): rank '
                        '{}: parameter {} of shape {} has optimizer state '
                        '{!r} of shape {}'.format(self.comm.rank, name,
                                                  param.shape, key,
                                                  value.shape))
        self.layout = layout
        self.packer = Packer([(n, p, None) for n, p in named])
        self.index = {n: i for i, (n, _) in enumerate(named)}
        bounds = self.comm.shard_bounds(self.packer.total)
        lo, hi = bounds[self.comm.rank], bounds[self.comm.rank + 1]
        self.pieces = []
        for (name, param), start in zip(named, self.packer.offsets):
            a, b = max(lo, start) - start, min(hi, start + param.size) - start
            if a < b:
                self.pieces.append(Piece(name, param, a, b,
                                         self._rule_for(param)))
        self._adopt()

    def _rule_for(self, param):
        rule = self.optimizer.create_update_rule()
        # the parameter's own overrides (``update_rule.hyperparam.lr = 0``)
        rule.hyperparam = Hyperparameter(param.update_rule.hyperparam)
        return rule

    def _adopt(self):
        """Move a whole state loaded into the parameters' rules into the
        pieces (each keeps its slice; the whole arrays are dropped)."""
        for piece in self.pieces:
            whole = piece.param.update_rule
            if whole.state is not None:
                piece.update_rule.t = whole.t
                piece.update_rule.state = {
                    k: v.reshape(-1)[piece.a:piece.b].copy()
                    for k, v in whole.state.items()}
        for _, p, _ in self.packer.entries:
            p.update_rule.state = None

    def _like(self):
        # The buffers live where the parameters do (BufferCache takes an
        # array of that device, not an array module).
        return self.packer.entries[0][1].array

    def _packed_params(self, model, tag, values):
        """A packed buffer holding ``values(piece)`` at each piece of this
        rank's shard (the rest undefined), in the parameters' dtype."""
        dtype = numpy.result_type(*[p.dtype for _, p, _ in
                                    self.packer.entries])
        buf = self.buffers.get(model, tag, self._like(), dtype,
                               self.packer.total)
        for piece in self.pieces:
            start = self.packer.offsets[self.index[piece.name]]
            buf[start + piece.a:start + piece.b] = values(piece)
        return buf

    # -- snapshots ------------------------------------------------------------
    @contextlib.contextmanager
    def gathered_state(self, model):
        """Inside, every parameter's rule holds its whole state (``t`` and
        arrays, as without sharding), gathered from every rank's pieces.
        Collective, on every rank. Saving a sharded state outside raises."""
        if self.layout is None:
            yield  # nothing stepped yet: the rules hold what they hold
            return
        params = self._gather(model)
        self.gathered = True
        try:
            yield
        finally:
            self.gathered = False
            for p in params:
                p.update_rule.state = None

    gathered = False

    def _gather(self, model):
        """Give every parameter of the pieces' layout its whole state in its
        rule, from every rank's pieces; returns those parameters.
        Collective."""
        steps = {}
        for mine in self.comm.allgather_obj(
                {p.name: p.update_rule.t for p in self.pieces}):
            steps.update(mine)
        whole = {}
        for key in self.optimizer.create_update_rule().state_names:
            buf = self._packed_params(model, 'packed', lambda piece: (
                piece.update_rule.state or {}).get(key, 0))
            self.comm.allgather_shards(buf)
            # the shapes the pieces were cut for (a parameter may have
            # changed shape since: _build then names it)
            for (name, p, _), o, (_, shape) in zip(
                    self.packer.entries, self.packer.offsets, self.layout):
                if steps.get(name):
                    whole.setdefault(name, {})[key] = buf[
                        o:o + numpy.prod(shape, dtype=int)].reshape(
                            shape).astype(p.dtype)
        for name, p, _ in self.packer.entries:
            p.update_rule.t = steps.get(name, 0)
            p.update_rule.state = whole.get(name)
        return [p for _, p, _ in self.packer.entries]

    def serialize(self, optimizer, serializer):
        loading = isinstance(serializer, Deserializer)
        if not loading and self.pieces and not self.gathered:
            raise RuntimeError(
                'multi-node optimizer with shard_state=True: rank {} holds '
                'only its shard of the optimizer state; save it inside '
                '"with optimizer.gathered_state():" on every rank '
                '(multi_node_snapshot does)'.format(self.comm.rank))
        optimizer.serialize(serializer)
        if loading and self.layout is not None:
            self._adopt()
