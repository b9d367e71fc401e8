"""The kernel seam: how fast an op runs, kept apart from what it computes.

An op's ``forward`` states its mathematics in plain ``xp`` code; that is
the teaching path, and it runs whenever no kernel takes the arrays at hand.
A *kernel* is a faster way to compute the same forward for one kind of
array. ``FunctionNode.apply`` calls :func:`forward`, which tries the
kernels registered for the node's type on that device, in order of
preference, and falls back to the body. Here the lookup finds none: the
kernels layer (``minichain/kernels/``, installed by one line of
``minichain/__init__.py`` marked ``# layer: kernels``) adds its backends
(:func:`add_backend`: ``'onednn'`` and ``'numpy'`` for NumPy arrays,
``'cuda'`` for CuPy arrays) and registers their kernels. Op modules never
import the kernels: the kernels know the ops, the ops do not know the
kernels (as tinygrad's tensor code knows no runtime).

The contract of a kernel: ``kernel(node, inputs)`` takes the node (for its
hyper-parameters) and the tuple of input arrays, and returns either the
tuple of output arrays that ``node.forward(inputs)`` would return, having
made the same ``retain_inputs`` / ``retain_outputs`` calls and set the same
attributes that the node's backward reads, or ``None`` to decline (a shape,
dtype or layout it does not take); then the next kernel, and finally the
body, runs. Every registered kernel is tested against its op's body.

An optimizer's update rule has the same seam (:func:`update`): its
``update_core`` is the plain update, and a kernel registered for the rule's
type, ``kernel(rule, param)``, may do the same update in place faster
(returning True) or decline (returning None). A whole step's parameters
are first offered together (:func:`update_all`) to the kernels registered
for :class:`UpdateAll`, which may update many in one launch.

One switch turns every kernel off: ``config.use_kernels`` (default True;
``MINICHAIN_KERNELS=0`` in the environment makes it False), for instance to
run the gradient checks on the bodies::

    with minichain.using_config('use_kernels', False):
        ...  # every op runs its body, every update rule its update_core

A backend's package registers its kernels when loaded, lazily, on the
first forward on its device, so that ``import minichain`` stays light and
no import circle runs through here. The adding of a kernel, and how to
prove it equals the body: docs/kernels.md.
"""
import numpy

from minichain.configuration import config

__all__ = ['add_backend', 'register', 'registered', 'forward', 'update',
           'UpdateAll', 'update_all', 'backends_for', 'parameters_changed',
           'parameters_version']

# (node type, backend name) -> kernel
registry = {}
# backend name -> load(): imports what registers its kernels (the hook the
# kernels layer fills; empty here, so every op runs its body)
_backends = {}
_order = {'cpu': (), 'gpu': ()}  # backend names for NumPy / CuPy arrays
_loaded = set()
# Bumped by every parameter update through :func:`update` (and by
# :func:`parameters_changed`): what a kernel that caches something derived
# from a parameter's values checks before using it.
_parameters_version = 0


def add_backend(name, arrays, load):
    """Add the kernel backend ``name`` for ``arrays`` (``'cpu'``: NumPy,
    ``'gpu'``: CuPy), tried after those added before; ``load()`` imports
    what registers its kernels, at its first use."""
    _backends[name] = load
    _order[arrays] += (name,)


def register(node_type, backend, kernel):
    """Make ``kernel`` the ``backend`` kernel of ``node_type``'s forward
    (a FunctionNode subclass), or of its update (an UpdateRule subclass)."""
    if backend not in _backends:
        raise ValueError('kernels.register: unknown backend {!r} for {}; '
                         'known: {}'.format(backend, node_type.__name__,
                                            ', '.join(sorted(_backends))))
    registry[node_type, backend] = kernel


def registered(node_type, backend):
    """The kernel registered for ``node_type`` on ``backend``, or None."""
    _load(backend)
    return registry.get((node_type, backend))


def _load(backend):
    if backend not in _loaded and backend in _backends:
        _loaded.add(backend)
        _backends[backend]()


def backends_for(inputs):
    """The kernel backends to try for these input arrays, best first (none
    when ``config.use_kernels`` is off)."""
    if not config.use_kernels:
        return ()
    first = next((a for a in inputs if a is not None), None)
    if isinstance(first, numpy.ndarray):
        # (the oneDNN backend decides itself whether its library loaded and
        # whether config.use_onednn lets it run; it declines otherwise)
        return _order['cpu']
    if first is not None and type(first).__module__.startswith('cupy'):
        return _order['gpu']
    return ()


def forward(node, inputs):
    """Run ``node``'s forward on ``inputs``: the first kernel that takes
    them, else the node's own body."""
    node_type = type(node)
    for backend in backends_for(inputs):
        kernel = registered(node_type, backend)
        if kernel is not None:
            outputs = kernel(node, inputs)
            if outputs is not None:
                return outputs
    return node.forward(inputs)


def update(rule, param):
    """Update ``param`` in place with ``rule``: the first kernel registered
    for the rule's type that takes the arrays, else ``rule.update_core``."""
    global _parameters_version
    _parameters_version += 1
    rule_type = type(rule)
    for backend in backends_for((param.array,)):
        kernel = registered(rule_type, backend)
        if kernel is not None and kernel(rule, param):
            return
    rule.update_core(param)


class UpdateAll:
    """What a kernel that takes a whole optimizer step registers for:
    ``kernel(pairs)`` updates some of the ``(rule, param)`` pairs in place
    as each ``rule.update(param)`` would (calling ``rule.prepare(param)``
    first), and returns the others."""


def update_all(pairs):
    """Offer a step's ``(rule, param)`` pairs (parameters with data) to the
    :class:`UpdateAll` kernels of their device; returns the pairs left,
    which the optimizer updates one by one (all of them here)."""
    global _parameters_version
    _parameters_version += 1
    # one array of each kind (NumPy, CuPy) asks for its backends
    firsts = {type(param.array): param.array for _, param in pairs}
    names = [b for a in firsts.values() for b in backends_for([a])]
    for backend in dict.fromkeys(names):  # a kernel returns what it leaves
        kernel = registered(UpdateAll, backend)
        if kernel is not None:
            pairs = kernel(pairs)
    return pairs


def parameters_version():
    """A number that changes whenever parameters may have changed in
    place: at each update through :func:`update`, and at each
    :func:`parameters_changed`."""
    return _parameters_version


def parameters_changed():
    """Say that parameter arrays were written in place other than by an
    optimizer's update (a load, a broadcast, a copy): caches derived from
    their values are stale (see onednn/_plan.py, ``CACHE_WEIGHTS``)."""
    global _parameters_version
    _parameters_version += 1
