"""A library backend's switch (oneDNN, cuDNN): ``config.use_NAME``'s three
modes, and kernels that decline while it says no.

- ``'auto'``: run when the library can be used, else decline, silently;
- ``'always'``: as 'auto', but a library that cannot be used is an error
  (one line: why, and how to install it);
- ``'never'``: decline.
"""
from minichain.configuration import config

MODES = ('auto', 'always', 'never')


def enabled(name, library, problem):
    """Whether the ``name`` kernels (``config.use_<name>``, default from
    ``MINICHAIN_<NAME>``) run now; ``problem()`` is '' when ``library``
    can be used, else why (with how to install it)."""
    mode = getattr(config, 'use_' + name)
    if mode == 'never':
        return False
    if mode not in MODES:
        raise ValueError('config.use_{} must be one of {}, got {!r} '
                         '(MINICHAIN_{} sets its default)'.format(
                             name, ', '.join(map(repr, MODES)), mode,
                             name.upper()))
    why = problem()
    if not why:
        return True
    if mode == 'always':
        raise RuntimeError("config.use_{} is 'always' but {} cannot be used: "
                           "{}; or set MINICHAIN_{}=auto".format(
                               name, library, why, name.upper()))
    return False


def gated(kernel, enabled):
    """The kernel, declining whenever ``enabled()`` says no."""
    def run(node, inputs):
        return kernel(node, inputs) if enabled() else None
    run.__name__ = run.__qualname__ = kernel.__name__
    run.__wrapped__ = kernel
    return run
