"""Link, Chain and ChainList: parameters in layers (Sequential, a
ChainList of layers called in turn, is ``sequential.py``).

A Link owns Parameters and persistent values (non-trainable state such as
batch-norm running statistics); a Chain or ChainList also owns child links.
Everything is registered by attribute assignment inside ``init_scope()``.

Every enumeration that other processes must agree on (``namedparams``,
``namedlinks``, ``namedpersistents``) is sorted by full path, never taken from
a set or dict of names: data-parallel training packs gradients in this order.

The three classes stay in one file, as Chainer keeps them; how arrays are
copied and moved across host and devices is ``_link_arrays.py``.
"""
import contextlib
import warnings

import numpy

from minichain import _grad_ready, _link_arrays, backend
from minichain.variable import Parameter


class Link:
    """A layer: Parameters and persistent values under one name.

    Register parameters by assigning them inside ``init_scope``::

        class Scale(minichain.Link):
            def __init__(self, n):
                super().__init__()
                with self.init_scope():
                    self.s = minichain.Parameter(
                        numpy.ones(n, dtype=numpy.float32))

            def forward(self, x):
                return x * F.broadcast_to(self.s, x.shape)

    Calling the link calls ``forward``. ``name`` is set by the parent link.
    """

    def __init__(self):
        self._params = []       # registration order; enumeration sorts
        self._persistent = []
        self._within_init_scope = False
        self._device_id = -1
        self.name = None

    # -- registration ---------------------------------------------------------
    @contextlib.contextmanager
    def init_scope(self):
        """A ``with`` block inside which assigned Parameters (and, for a
        Chain, links) are registered."""
        old = self._within_init_scope
        self._within_init_scope = True
        try:
            yield
        finally:
            self._within_init_scope = old

    def __setattr__(self, name, value):
        if self.__dict__.get('_within_init_scope'):
            if isinstance(value, Parameter):
                value.name = name
                if name not in self._params:
                    self._params.append(name)
            elif name in self.__dict__.get('_params', ()):
                self._params.remove(name)
        super().__setattr__(name, value)

    def __delattr__(self, name):
        if name in self._params:
            self._params.remove(name)
        if name in self._persistent:
            self._persistent.remove(name)
        super().__delattr__(name)

    def add_param(self, name, shape=None, dtype=numpy.float32,
                  initializer=None):
        """Register a new Parameter ``name`` (same as assigning it in
        ``init_scope``).

        Args:
            name: attribute name; must not exist yet.
            shape: if given, the data is created now; otherwise later by
                ``param.initialize(shape)``.
            dtype: dtype used when ``initializer`` is None (NaN-filled data,
                as in Chainer) or a scalar.
            initializer: an initializer, a scalar, an array or None.
        """
        from minichain import initializers
        if name in self.__dict__:
            raise AttributeError('{}.add_param: attribute {!r} already exists'
                                 .format(type(self).__name__, name))
        init = initializers.get_initializer(
            initializer, default=initializers.NaN(dtype), dtype=dtype)
        param = Parameter(init)
        if shape is not None:
            param.initialize(shape)
        with self.init_scope():
            setattr(self, name, param)

    def register_persistent(self, name):
        """Mark the existing attribute ``name`` (an array or a scalar) as
        persistent: serializers save it and ``to_gpu`` moves it."""
        if not hasattr(self, name):
            raise AttributeError('{}.register_persistent: no attribute {!r}; '
                                 'assign it first'.format(type(self).__name__,
                                                          name))
        if name not in self._persistent:
            self._persistent.append(name)

    def add_persistent(self, name, value):
        """Set attribute ``name`` to ``value`` and register it persistent."""
        if name in self.__dict__:
            raise AttributeError('{}.add_persistent: attribute {!r} already '
                                 'exists'.format(type(self).__name__, name))
        setattr(self, name, value)
        self.register_persistent(name)

    # -- enumeration ----------------------------------------------------------
    def _own_params(self):
        """``(name, param)`` pairs of this link only, sorted by name."""
        return [(n, self.__dict__[n]) for n in sorted(self._params)]

    def _named_children(self):
        """``(name, child)`` pairs in registration order (none for a Link)."""
        return []

    def children(self):
        """Yield the direct child links in registration order."""
        for _, child in self._named_children():
            yield child

    def namedlinks(self, skipself=False):
        """Yield ``(path, link)`` for this link ('/') and every descendant,
        sorted by path; a link reachable twice is yielded once."""
        found = []
        self._collect_links('', found)
        seen = set()
        for path, link in sorted(found, key=lambda pair: pair[0]):
            if id(link) in seen or (skipself and link is self):
                continue
            seen.add(id(link))
            yield path or '/', link

    def _collect_links(self, prefix, out):
        out.append((prefix, self))
        for name, child in self._named_children():
            child._collect_links(prefix + '/' + name, out)

    def links(self, skipself=False):
        """Yield this link (unless ``skipself``) and all descendants, in
        ``namedlinks`` order."""
        for _, link in self.namedlinks(skipself):
            yield link

    def namedparams(self, include_uninit=True):
        """Yield ``(path, param)`` such as ``('/conv1/W', W)``, sorted by
        path. A parameter shared by two links is yielded once, under its
        first path."""
        found = []
        for path, link in self.namedlinks():
            prefix = '' if path == '/' else path
            for name, param in link._own_params():
                found.append((prefix + '/' + name, param))
        seen = set()
        for path, param in sorted(found, key=lambda pair: pair[0]):
            if id(param) in seen:
                continue
            seen.add(id(param))
            if include_uninit or param.is_initialized:
                yield path, param

    def params(self, include_uninit=True):
        """Yield every parameter, in ``namedparams`` order."""
        for _, param in self.namedparams(include_uninit):
            yield param

    def namedpersistents(self):
        """Yield ``(path, value)`` such as ``('/bn/avg_mean', array)`` for
        every persistent value, sorted by path."""
        found = []
        for path, link in self.namedlinks():
            prefix = '' if path == '/' else path
            for name in link._persistent:
                found.append((prefix + '/' + name, getattr(link, name)))
        yield from sorted(found, key=lambda pair: pair[0])

    # -- gradients and parameter values ---------------------------------------
    def cleargrads(self):
        """Set every parameter's gradient to None."""
        for param in self.params():
            param.cleargrad()

    def register_grad_hook(self, hook, done=None, between=None):
        """Call ``hook(param)`` during each backward as soon as the gradient
        of each of this link's parameters is final (see
        :meth:`minichain.Variable.register_grad_hook`), and
        ``done(missing)`` at the end of each backward that reached one of
        them: ``missing`` lists the ``(path, param)`` that got no gradient
        in it; ``between()``, after every function of such a backward while
        some of them are not final yet. Parameters added later are not
        hooked. Returns a handle with ``remove()``."""
        return _grad_ready.add_link_hook(self, hook, done, between)

    def zerograds(self):
        """Set every initialized parameter's gradient to zeros (uninitialized
        ones have no shape yet and are skipped)."""
        for param in self.params(include_uninit=False):
            param.zerograd()

    def count_params(self):
        """Total number of elements in the initialized parameters (warns
        when some are still uninitialized)."""
        total, missing = 0, []
        for path, param in self.namedparams():
            if param.is_initialized:
                total += param.size
            else:
                missing.append(path)
        if missing:
            warnings.warn('{}.count_params: uninitialized parameters are not '
                          'counted: {}'.format(type(self).__name__,
                                               ', '.join(missing)))
        return total

    def copyparams(self, other, copy_persistent=True):
        """Copy the values of ``other``'s parameters (and persistents) into
        this link's, in place, matching them by path. Works across host and
        GPU; an uninitialized parameter here is initialized to the source's
        shape first.

        Raises:
            ValueError: a path is missing in ``other``, a source parameter is
                uninitialized while this one is not, or shapes differ.
        """
        _link_arrays.copy_params(self, other, copy_persistent)

    # -- devices --------------------------------------------------------------
    @property
    def xp(self):
        """``numpy`` or ``cupy``: where this link's arrays live."""
        return numpy if self._device_id < 0 else backend.get_cupy()

    @property
    def device_id(self):
        """The CUDA device id, or -1 on the host."""
        return self._device_id

    def to_cpu(self):
        """Move parameters, gradients and persistents to the host, in place.
        Returns self."""
        _link_arrays.move(self, -1)
        return self

    def to_gpu(self, device=None):
        """Move parameters, gradients and persistents to the GPU ``device``
        (None = the current one), in place. Uninitialized parameters are
        created there later. Returns self."""
        _link_arrays.move(self, backend.cuda_device(device).id)
        return self

    # -- serialization and calling --------------------------------------------
    def serialize(self, serializer):
        """Save or load parameters, persistents and children through
        ``serializer`` (``s(key, value)`` and ``s[child]``)."""
        for name, param in self._own_params():
            data = serializer(name, param.array)
            if not param.is_initialized and data is not None:
                # Loading into a lazily initialized parameter.
                param.initialize(data.shape)
                _link_arrays.copy_into(param.array, data, '{}.serialize ({})'
                                       .format(type(self).__name__, name))
        for name in self._persistent:
            setattr(self, name, serializer(name, getattr(self, name)))
        for name, child in self._named_children():
            child.serialize(serializer[name])

    def forward(self, *args, **kwargs):
        """The computation of this link; subclasses override it."""
        raise NotImplementedError('{} does not define forward'.format(
            type(self).__name__))

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def _repr_args(self):
        """Constructor-like arguments shown by ``repr`` (override)."""
        return ''

    def __repr__(self):
        head = '{}({}'.format(type(self).__name__, self._repr_args())
        kids = self._named_children()
        if not kids:
            return head + ')'
        lines = [head]
        for name, child in kids:
            body = repr(child).replace('\n', '\n  ')
            lines.append('  ({}): {},'.format(name, body))
        return '\n'.join(lines) + '\n)'

    def to_device(self, device):
        """Move the link to ``device`` (any ``minichain.get_device`` spec:
        ``-1``, ``'@numpy'``, ``0``, ``'@cupy:0'``, a Device); returns
        self."""
        from minichain.device import get_device
        device = get_device(device)
        if device.device_id < 0:
            return self.to_cpu()
        return self.to_gpu(device.device_id)


class Chain(Link):
    """A link whose child links are registered by assignment in
    ``init_scope``::

        class MLP(minichain.Chain):
            def __init__(self):
                super().__init__()
                with self.init_scope():
                    self.l1 = L.Linear(None, 100)
                    self.l2 = L.Linear(100, 10)

            def forward(self, x):
                return self.l2(F.relu(self.l1(x)))

    or as keywords, as in Chainer v1 and ChainerMN's examples:
    ``super().__init__(l1=L.Linear(None, 100), l2=L.Linear(100, 10))``."""

    def __init__(self, **links):
        super().__init__()
        self._children = []
        for name, link in links.items():
            self.add_link(name, link)

    def __setattr__(self, name, value):
        if self.__dict__.get('_within_init_scope'):
            if isinstance(value, Link):
                value.name = name
                if name not in self._children:
                    self._children.append(name)
            elif name in self.__dict__.get('_children', ()):
                self._children.remove(name)
        super().__setattr__(name, value)

    def __delattr__(self, name):
        if name in self._children:
            self._children.remove(name)
        super().__delattr__(name)

    def __getitem__(self, name):
        """The child link (or other attribute) called ``name``."""
        return getattr(self, name)

    def add_link(self, name, link):
        """Register ``link`` as the child ``name`` (same as assigning it in
        ``init_scope``)."""
        if not isinstance(link, Link):
            raise TypeError('{}.add_link: {!r} must be a Link, got {}'.format(
                type(self).__name__, name, type(link).__name__))
        if name in self.__dict__:
            raise AttributeError('{}.add_link: attribute {!r} already exists'
                                 .format(type(self).__name__, name))
        with self.init_scope():
            setattr(self, name, link)

    def _named_children(self):
        return [(n, self.__dict__[n]) for n in self._children]


class ChainList(Link):
    """A link holding an ordered list of child links, named '0', '1', ...

    Args:
        links: initial children, appended in order.
    """

    def __init__(self, *links):
        super().__init__()
        self._children = []
        for link in links:
            self.append(link)

    def append(self, link):
        """Add ``link`` as the next child."""
        if not isinstance(link, Link):
            raise TypeError('{}.append: expected a Link, got {}'.format(
                type(self).__name__, type(link).__name__))
        link.name = str(len(self._children))
        self._children.append(link)

    def add_link(self, link):
        """Chainer's name for ``append``."""
        self.append(link)

    def __getitem__(self, index):
        return self._children[index]

    def __len__(self):
        return len(self._children)

    def __iter__(self):
        return iter(self._children)

    def _named_children(self):
        return [(str(i), c) for i, c in enumerate(self._children)]
