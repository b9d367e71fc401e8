"""Optimizer base classes: Optimizer, GradientMethod, UpdateRule and helpers.

An optimizer owns a target link. ``GradientMethod.setup`` gives every
parameter an ``UpdateRule`` (``param.update_rule``) that keeps the parameter's
own state (momentum, Adam moments) next to it, on the same device, created
lazily at the first update. Hyper-parameters live in one ``Hyperparameter``
object per optimizer; each rule reads through its own, so one parameter can
override a value (``param.update_rule.hyperparam.lr = 0`` freezes it) while the
others follow the optimizer (``opt.lr = 0.01`` between steps).

Update rules write into the parameter and their state in place and never into
``param.grad``: the engine may hand two parameters the same gradient array
(``p + q``) or a read-only broadcast view (``F.sum(p)``).
"""
import collections
import contextlib
import math
import numbers

from minichain import backend, kernel_seam
from minichain._loss_scaling import LossScaling
from minichain.serializers.base import Deserializer


class Hyperparameter:
    """A set of named hyper-parameters that falls back to a parent.

    Reading a name that is not set here reads it from ``parent``; setting a
    name sets it here only. ``get_dict()`` flattens both levels. A value
    set for a name that the optimizer class declares with a
    :class:`HyperparameterProxy` is checked against its limits first,
    however it is set (``opt.lr = v``, ``opt.hyperparam.lr = v``, or one
    parameter's ``update_rule.hyperparam.lr = v``).

    Args:
        parent: another Hyperparameter, or None.
        owner: the optimizer class whose proxies check the values (by
            default the parent's).
    """

    def __init__(self, parent=None, owner=None):
        self.__dict__['_parent'] = parent
        self.__dict__['_owner'] = owner or getattr(parent, '_owner', None)

    def __getattr__(self, name):  # only called when normal lookup fails
        # .get: copy and pickle probe attributes before __dict__ is filled
        parent = self.__dict__.get('_parent')
        if parent is None or name.startswith('_'):
            raise AttributeError('hyper-parameter {!r} is not defined'
                                 .format(name))
        return getattr(parent, name)

    def __setattr__(self, name, value):
        owner = self.__dict__.get('_owner')
        proxy = getattr(owner, name, None)
        if isinstance(proxy, HyperparameterProxy):
            value = proxy.check(owner.__name__, value)
        self.__dict__[name] = value

    @property
    def parent(self):
        """The Hyperparameter this one falls back to (or None)."""
        return self._parent

    def get_dict(self):
        """A dict of every visible hyper-parameter (own values win)."""
        values = {} if self._parent is None else self._parent.get_dict()
        values.update((k, v) for k, v in self.__dict__.items()
                      if not k.startswith('_'))
        return values

    def __repr__(self):
        items = sorted(self.get_dict().items())
        return 'Hyperparameter({})'.format(', '.join(
            '{}={!r}'.format(k, v) for k, v in items))


class HyperparameterProxy:
    """A class attribute exposing ``obj.hyperparam.<name>`` as ``obj.<name>``,
    and the one place that says which values it takes.

    Example: ``lr = HyperparameterProxy('lr', low=0)`` on an optimizer
    makes ``opt.lr = 0.1`` set the value every update rule reads, and
    ``opt.lr = -1`` (or NaN, or a string) raise an error naming the
    optimizer, ``lr`` and the value, in the constructor and at any time
    after (see :func:`check_hyperparameter` for ``low``, ``high`` and
    ``open_high``).
    """

    def __init__(self, name, low=None, high=None, open_high=False):
        self.name = name
        self.limits = low, high, open_high
        self.__doc__ = 'Alias of ``self.hyperparam.{}``.'.format(name)

    def check(self, where, value):
        """``value`` if it is a valid value, else the error."""
        return check_hyperparameter(where, self.name, value, *self.limits)

    def __get__(self, obj, cls=None):
        if obj is None:
            return self
        return getattr(obj.hyperparam, self.name)

    def __set__(self, obj, value):
        setattr(obj.hyperparam, self.name, value)


def check_hyperparameter(where, name, value, low=None, high=None,
                         open_high=False):
    """Validate a real hyper-parameter and return it.

    Raises ``TypeError`` unless ``value`` is a real number, ``ValueError`` when
    it is not finite, is below ``low`` or above ``high`` (or equal to ``high``
    when ``open_high``). ``where`` names the caller in the message.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError('{}: {} must be a real number, got {!r} ({})'.format(
            where, name, value, type(value).__name__))
    if not math.isfinite(value):
        raise ValueError('{}: {} must be finite, got {}'.format(
            where, name, value))
    if low is not None and value < low:
        raise ValueError('{}: {} must be >= {}, got {}'.format(
            where, name, low, value))
    if high is not None and (value > high or (open_high and value == high)):
        raise ValueError('{}: {} must be {} {}, got {}'.format(
            where, name, '<' if open_high else '<=', high, value))
    return value


def _device_scope(array):
    """Make ``array``'s GPU current (CuPy allocates on the current one)."""
    device_id = backend.get_device_id(array)
    if device_id < 0:
        return contextlib.nullcontext()
    return backend.cuda_device(device_id)


class Workspace:
    """Scratch arrays shared by the update rules of one optimizer.

    ``get(like, index)`` returns an uninitialized array of ``like``'s shape,
    dtype and device, a view of a flat buffer kept between steps, so that a
    rule's temporaries (``lr * grad``) cost no allocation per step. Buffers
    grow to the largest parameter seen; ``index`` selects an independent
    buffer when a rule needs two temporaries at once.
    """

    def __init__(self):
        self._buffers = {}

    def get(self, like, index=0):
        """A scratch array shaped like ``like`` (contents undefined)."""
        key = (backend.get_device_id(like), like.dtype.str, index)
        buf = self._buffers.get(key)
        if buf is None or buf.size < like.size:
            xp = backend.get_array_module(like)
            with _device_scope(like):
                buf = xp.empty(like.size, dtype=like.dtype)
            self._buffers[key] = buf
        return buf[:like.size].reshape(like.shape)


class UpdateRule:
    """How one parameter is updated; the state lives here.

    Subclasses set ``state_names`` (the state arrays, each created as zeros
    like the parameter) and implement ``update_core(param)``, which updates
    ``param.array`` and ``self.state`` in place with ``self.hyperparam``.

    Args:
        parent_hyperparam: the optimizer's Hyperparameter to fall back to.
        workspace: a Workspace for temporaries (a private one if None).

    Attributes:
        hyperparam: this rule's Hyperparameter (set a value to override it
            for this parameter only).
        state: dict of state arrays, or None before the first update.
        t: number of updates this parameter received.
        enabled: set False to freeze the parameter.
    """

    state_names = ()
    # Whether each element's step reads only that element (of the
    # parameter, gradient and state) and the step count: such a rule can
    # update a parameter in pieces, as a sharded optimizer state does
    # (minichain.dist, shard_state=True). A rule that reads a whole
    # parameter (its norm) leaves it False.
    elementwise = False

    def __init__(self, parent_hyperparam=None, workspace=None):
        self.hyperparam = Hyperparameter(parent_hyperparam)
        self.workspace = Workspace() if workspace is None else workspace
        self.state = None
        self.t = 0
        self.enabled = True

    def update(self, param):
        """Update ``param`` from ``param.grad`` (skipped when it has no
        gradient or data, or the rule is disabled)."""
        with _device_scope(param.array):
            if self.prepare(param):
                # The seam: a kernel, else update_core (kernel_seam.py).
                kernel_seam.update(self, param)

    def prepare(self, param):
        """Count the step and make the state ready on ``param``'s device
        (the current one), as :meth:`update` does before the step; False,
        doing nothing, when ``param`` is skipped. A kernel that updates
        many parameters at once calls it first (kernel_seam.update_all)."""
        if not self.enabled or param.array is None or param.grad is None:
            return False
        self.t += 1
        if self.state is None:
            self.init_state(param)
        else:
            self._follow_device(param.array)
        return True

    def init_state(self, param):
        """Create every state array as zeros like ``param.array``."""
        xp = backend.get_array_module(param.array)
        self.state = {name: xp.zeros_like(param.array)
                      for name in self.state_names}

    def _follow_device(self, array):
        """Move the state to ``array``'s device if the parameter moved."""
        device_id = backend.get_device_id(array)
        for name, value in self.state.items():
            if backend.get_device_id(value) != device_id:
                self.state[name] = (backend.to_cpu(value) if device_id < 0
                                    else backend.to_gpu(value, device_id))

    def update_core(self, param):
        """Apply one step to ``param.array`` in place (subclasses)."""
        raise NotImplementedError(type(self).__name__ + '.update_core')

    def serialize(self, serializer):
        """Save or load ``t`` and the state arrays.

        A rule that never ran (``t == 0``) has no state and stores none;
        loading ``t == 0`` drops any state. Loading into a rule without state
        creates it from the stored arrays, on the host (the first update
        moves it to the parameter's device).
        """
        self.t = serializer('t', self.t)
        if not isinstance(serializer, Deserializer):
            for name, value in (self.state or {}).items():
                serializer(name, value)
            return
        if self.t == 0:
            self.state = None
            return
        if self.state is None:
            self.state = {name: serializer(name, None)
                          for name in self.state_names}
        else:
            for name, value in self.state.items():
                self.state[name] = serializer(name, value)


class Optimizer(LossScaling):
    """Base class of optimizers: a target, counters, hooks and the loss
    scale (``loss_scaling()``, minichain/_loss_scaling.py).

    Attributes:
        target: the link being optimized (set by ``setup``).
        t: number of ``update`` calls so far.
        epoch: counter advanced by ``new_epoch()``.
    """

    target = None

    def __init__(self):
        self.t = 0
        self.epoch = 0
        self._pre_hooks = collections.OrderedDict()
        self._post_hooks = collections.OrderedDict()

    def setup(self, link):
        """Attach to ``link`` (a Link) and reset the counters; returns self."""
        if not hasattr(link, 'namedparams'):
            raise TypeError('{}.setup: expected a Link, got {}'.format(
                type(self).__name__, type(link).__name__))
        self.target = link
        self.t = 0
        self.epoch = 0
        return self

    def _check_setup(self, where):
        if self.target is None:
            raise RuntimeError('{}.{}: call setup(link) first'.format(
                type(self).__name__, where))

    def update(self, lossfun=None, *args, **kwds):
        """Take one step (subclasses)."""
        raise NotImplementedError(type(self).__name__ + '.update')

    def new_epoch(self):
        """Advance ``epoch`` by one (called by iterators and updaters)."""
        self.epoch += 1

    def add_hook(self, hook, name=None, timing='pre'):
        """Register ``hook(optimizer)`` to run before (``'pre'``) or after
        (``'post'``) each update.

        Args:
            hook: a callable taking the optimizer.
            name: its unique name; default ``hook.name``, else the
                function's or class's name.
            timing: ``'pre'`` (before the parameters change, e.g. to edit
                gradients) or ``'post'``.
        """
        if not callable(hook):
            raise TypeError('{}.add_hook: hook must be callable, got {}'
                            .format(type(self).__name__, type(hook).__name__))
        if timing not in ('pre', 'post'):
            raise ValueError("{}.add_hook: timing must be 'pre' or 'post', "
                             'got {!r}'.format(type(self).__name__, timing))
        if name is None:
            name = getattr(hook, 'name', None) or getattr(
                hook, '__name__', type(hook).__name__)
        if name in self._pre_hooks or name in self._post_hooks:
            raise KeyError('{}.add_hook: a hook named {!r} already exists'
                           .format(type(self).__name__, name))
        hooks = self._pre_hooks if timing == 'pre' else self._post_hooks
        hooks[name] = hook

    def remove_hook(self, name):
        """Unregister the hook called ``name`` (KeyError if there is none)."""
        for hooks in (self._pre_hooks, self._post_hooks):
            if name in hooks:
                del hooks[name]
                return
        raise KeyError('{}.remove_hook: no hook named {!r}'.format(
            type(self).__name__, name))

    def call_hooks(self, timing='pre'):
        """Run the hooks of ``timing`` in registration order."""
        hooks = self._pre_hooks if timing == 'pre' else self._post_hooks
        for hook in list(hooks.values()):
            hook(self)

    def serialize(self, serializer):
        """Save or load ``t`` and ``epoch``."""
        self.t = serializer('t', self.t)
        self.epoch = serializer('epoch', self.epoch)


class GradientMethod(Optimizer):
    """An optimizer that updates each parameter from its gradient by a rule.

    Subclasses implement ``create_update_rule()``. ``update()`` runs the
    'pre' hooks, gives every parameter with a gradient one step of its rule
    (in ``namedparams`` order), then the 'post' hooks.

    Attributes:
        hyperparam: the Hyperparameter every rule falls back to.
    """

    def __init__(self):
        super().__init__()
        self.hyperparam = Hyperparameter(owner=type(self))
        self._workspace = Workspace()

    def setup(self, link):
        """Attach to ``link`` and give each parameter a fresh update rule."""
        super().setup(link)
        for param in link.params():
            param.update_rule = self.create_update_rule()
        return self

    def create_update_rule(self):
        """A new UpdateRule reading this optimizer's hyper-parameters."""
        raise NotImplementedError(type(self).__name__ + '.create_update_rule')

    def _rule_of(self, param):
        # Parameters registered after setup get a rule on first use.
        if param.update_rule is None:
            param.update_rule = self.create_update_rule()
        return param.update_rule

    def update(self, lossfun=None, *args, **kwds):
        """Take one optimization step.

        Args:
            lossfun: if given, gradients are cleared, ``loss = lossfun(*args,
                **kwds)`` is computed and ``loss.backward()`` run first
                (on ``loss * loss_scale`` with loss scaling); otherwise the
                existing gradients are used (and ``args`` are ignored, as a
                data-parallel wrapper passes them on).

        Parameters whose ``grad`` is None are left unchanged. With loss
        scaling the gradients are divided by the scale before the hooks;
        with dynamic loss scaling an update whose gradients hold inf or
        NaN is skipped (``t`` still counts it) and the scale adapts.
        """
        self._check_setup('update')
        if lossfun is not None:
            self.target.cleargrads()
            loss = lossfun(*args, **kwds)
            (loss if self._loss_scale is None else
             loss * self._loss_scale).backward()
            del loss
        self.check_nan_in_grads()
        safe = self.is_safe_to_update()
        if safe:
            self.unscale_grads()
        self.call_hooks('pre')
        self.t += 1
        if safe:
            pairs = [(self._rule_of(param), param)
                     for param in self.target.params(include_uninit=False)]
            # a kernel may take them all at once; the rest one by one
            for rule, param in kernel_seam.update_all(pairs):
                rule.update(param)
        self.call_hooks('post')
        self.update_loss_scale()

    def serialize(self, serializer):
        """Save or load ``t``, ``epoch`` and every rule's ``t`` and state,
        the latter under the parameter's path (``'l1/W/v'``)."""
        self._check_setup('serialize')
        super().serialize(serializer)
        for name, param in self.target.namedparams():
            self._rule_of(param).serialize(serializer[name])
