"""The code of a docs page that does not run here, checked without running
it: the bodies of top-level ``if`` statements whose condition was false
(``if gpu:`` on a machine without one, ``if rank == 0:`` on rank 1), and the
blocks marked not to run, so that a renamed attribute fails a test even
where no GPU or cluster is at hand.

The check follows the code in order with the page's namespace after it ran
(real modules, classes, functions and objects) and learns from the code
itself: ``import`` lines are done, a name bound to ``SomeClass(...)`` is an
instance of that class, ``dist.create_communicator('pure_nccl')`` an
instance of that communicator's class (with its layers). On what it knows
it checks that every name is defined, that every attribute exists (on an
instance: on its class, or assigned as ``self.name`` in a method of the
class or its bases) and that every call binds to the callee's signature.
What it cannot know (a call's result, an item) it leaves alone. A block
marked not to run may be a fragment: its undefined names, and imports of
packages not installed here, are allowed there.
"""
import ast
import builtins
import functools
import importlib
import importlib.util
import inspect
import textwrap
import types

UNKNOWN = object()


class Instance:
    """An object known by its class only."""

    def __init__(self, cls):
        self.cls = cls


class Method:
    """A function looked up on an Instance: called without ``self``."""

    def __init__(self, func):
        self.func = func


@functools.lru_cache(maxsize=None)
def instance_attributes(cls):
    """Names assigned as ``self.name`` in the methods of ``cls`` and of its
    bases (those whose source can be read)."""
    names = set()
    for klass in cls.__mro__:
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError, SyntaxError):
            continue
        names.update(node.attr for node in ast.walk(tree)
                     if isinstance(node, ast.Attribute)
                     and isinstance(node.value, ast.Name)
                     and node.value.id == 'self'
                     and isinstance(node.ctx, ast.Store))
        names.update(getattr(klass, '__slots__', ()))
    return frozenset(names)


def _communicator(args):
    """What ``dist.create_communicator(name)`` returns, by its name."""
    from minichain import dist
    from minichain.dist.communicator_base import with_layers
    name = args[0] if args else None
    if name not in getattr(dist, '_COMMUNICATORS', {}):
        return UNKNOWN
    module, cls = dist._COMMUNICATORS[name]
    return Instance(with_layers(getattr(importlib.import_module(module), cls),
                                dist.default_layers()))


def _factories():
    from minichain import dist
    return {dist.create_communicator: _communicator}


class Check:
    """Walks statements; ``errors`` collects ``(line, message)``."""

    def __init__(self, namespace, strict):
        self.scope, self.strict, self.errors = dict(namespace), strict, []
        self.factories = _factories()

    def error(self, node, message):
        self.errors.append((node.lineno, message))

    # -- statements ----------------------------------------------------------
    def run(self, statements):
        for node in statements:
            self.statement(node)

    def statement(self, node):
        if isinstance(node, ast.Import):
            for alias in node.names:
                module = self.module(node, alias.name)
                top = alias.name.split('.')[0]
                self.scope[alias.asname or top] = module if alias.asname \
                    else self.module(node, top)
        elif isinstance(node, ast.ImportFrom):
            module = self.module(node, '.' * node.level + (node.module or ''))
            for alias in node.names:
                self.scope[alias.asname or alias.name] = self.attribute(
                    node, module, alias.name)
        elif isinstance(node, ast.Assign):
            value = self.value(node.value)
            for target in node.targets:
                self.bind(target, value)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef,
                               ast.ClassDef)):
            for expr in node.decorator_list + getattr(node, 'bases', []):
                self.value(expr)
            inner = Check(self.scope, self.strict)
            if not isinstance(node, ast.ClassDef):
                for arg in ast.walk(node.args):
                    if isinstance(arg, ast.arg):
                        inner.scope[arg.arg] = UNKNOWN
            inner.run(node.body)
            self.errors += inner.errors
            self.scope[node.name] = UNKNOWN
        else:  # for, with, if, try, expressions...: every part in order
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.stmt):
                    self.statement(child)
                elif isinstance(child, ast.ExceptHandler):
                    if child.type is not None:
                        self.value(child.type)
                    if child.name:
                        self.scope[child.name] = UNKNOWN
                    self.run(child.body)
                elif isinstance(child, ast.withitem):
                    self.value(child.context_expr)
                    if child.optional_vars is not None:
                        self.bind(child.optional_vars, UNKNOWN)
                elif isinstance(child, ast.expr):
                    if isinstance(getattr(child, 'ctx', None), ast.Store):
                        self.bind(child, UNKNOWN)
                    else:
                        self.value(child)

    def bind(self, target, value):
        if isinstance(target, ast.Name):
            self.scope[target.id] = value
        else:  # a tuple, an item, an attribute: what is inside is unknown
            for node in ast.walk(target):
                if isinstance(node, ast.Name) and isinstance(node.ctx,
                                                             ast.Store):
                    self.scope[node.id] = UNKNOWN
                elif isinstance(node, ast.expr) and not isinstance(
                        getattr(node, 'ctx', None), ast.Store):
                    self.value(node)

    def module(self, node, name):
        """The module; an error unless it is of a package not installed
        here (CuPy without a GPU), or, in a fragment, not minichain's."""
        try:
            return importlib.import_module(name)
        except ImportError as e:
            top = name.split('.')[0]
            if top == 'minichain' or self.strict and top and \
                    importlib.util.find_spec(top) is not None:
                self.error(node, 'import {}: {}'.format(name, e))
            return UNKNOWN

    # -- expressions ---------------------------------------------------------
    def value(self, node):
        if isinstance(node, ast.Name):
            if node.id in self.scope:
                return self.scope[node.id]
            if hasattr(builtins, node.id):
                return getattr(builtins, node.id)
            if self.strict:
                self.error(node, 'name {!r} is not defined'.format(node.id))
            return UNKNOWN
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Attribute):
            return self.attribute(node, self.value(node.value), node.attr)
        if isinstance(node, ast.Call):
            return self.call(node)
        if isinstance(node, (ast.Lambda, ast.ListComp, ast.SetComp,
                             ast.GeneratorExp, ast.DictComp)):
            inner = Check(self.scope, self.strict)
            for target in ast.walk(node):  # comprehension and lambda names
                if isinstance(target, ast.arg):
                    inner.scope[target.arg] = UNKNOWN
                elif isinstance(target, ast.Name) and isinstance(
                        target.ctx, ast.Store):
                    inner.scope[target.id] = UNKNOWN
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.expr):
                    inner.value(child)
                elif isinstance(child, ast.comprehension):
                    for part in [child.iter] + child.ifs:
                        inner.value(part)
            self.errors += inner.errors
            return UNKNOWN
        if isinstance(node, ast.NamedExpr):
            self.scope[node.target.id] = self.value(node.value)
            return self.scope[node.target.id]
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.expr):
                self.value(child)
            elif isinstance(child, ast.keyword):
                self.value(child.value)
        return UNKNOWN

    def attribute(self, node, owner, name):
        if owner is UNKNOWN or isinstance(owner, Method):
            return UNKNOWN
        if isinstance(owner, (types.ModuleType, type)):
            try:
                found = getattr(owner, name)
            except AttributeError:
                if isinstance(owner, types.ModuleType):
                    try:  # a submodule not imported yet
                        return importlib.import_module(
                            owner.__name__ + '.' + name)
                    except ImportError:
                        pass
                self.error(node, '{} has no attribute {!r}'.format(
                    owner.__name__, name))
                return UNKNOWN
            return UNKNOWN if isinstance(found, property) else found
        cls = owner.cls if isinstance(owner, Instance) else type(owner)
        if not isinstance(owner, Instance) and name in getattr(
                owner, '__dict__', {}):
            return vars(owner)[name]
        if hasattr(cls, name):
            found = inspect.getattr_static(cls, name)
            return Method(found) if inspect.isfunction(found) else UNKNOWN
        if name in instance_attributes(cls) or (
                not isinstance(owner, Instance) and hasattr(cls, '__getattr__')
                and hasattr(owner, name)):
            return UNKNOWN
        self.error(node, '{} object has no attribute {!r} (nor does any '
                   'method of its class assign self.{})'.format(
                       cls.__name__, name, name))
        return UNKNOWN

    def call(self, node):
        func = self.value(node.func)
        args = [self.value(a.value if isinstance(a, ast.Starred) else a)
                for a in node.args]
        for keyword in node.keywords:
            self.value(keyword.value)
        starred = any(isinstance(a, ast.Starred) for a in node.args) or any(
            k.arg is None for k in node.keywords)
        callee = func.func if isinstance(func, Method) else func
        if callee is not UNKNOWN and callable(callee) and not starred:
            try:
                signature = inspect.signature(callee)
            except (TypeError, ValueError):  # builtins without one
                signature = None
            if signature is not None:
                if isinstance(func, Method):
                    args = [None] + args  # self
                try:
                    signature.bind(*args, **{k.arg: None
                                             for k in node.keywords})
                except TypeError as e:
                    self.error(node, 'call of {}: {}'.format(
                        getattr(callee, '__qualname__', callee), e))
        if func in self.factories:
            return self.factories[func](
                [a.value for a in node.args if isinstance(a, ast.Constant)])
        if isinstance(func, type):
            return Instance(func)
        return UNKNOWN


def _false_condition(test, namespace):
    """Whether a top-level ``if``'s condition was false after the page ran
    (None: it calls something, so it is not evaluated again)."""
    if any(isinstance(n, (ast.Call, ast.NamedExpr)) for n in ast.walk(test)):
        return None
    try:
        return not eval(compile(ast.Expression(test), '<if>', 'eval'),
                        dict(namespace))
    except Exception:
        return None


def unrun_errors(page, namespace, all_blocks=False):
    """``(line, message)`` of every problem in the code of ``page`` that did
    not run: blocks marked not to run and the branches of top-level ``if``
    statements not taken; with ``all_blocks`` (a page that did not run at
    all), every runnable block in order, as one session would run them."""
    errors, whole = [], Check(namespace, strict=True)
    # One check per condition: on the machine (or rank) where it holds, the
    # earlier blocks under the same condition ran too (``if rank == 0:``
    # twice, the second using a name that the first bound).
    branches = {}
    for block in page.blocks:
        tree = ast.parse('\n' * (block.line - 1) + block.code)
        if all_blocks and block.run:
            whole.run(tree.body)
            continue
        if all_blocks or not block.run:
            check = Check(namespace, strict=False)
            check.run(tree.body)
            errors += check.errors
            continue
        for node in tree.body:
            if not isinstance(node, ast.If):
                continue
            false = _false_condition(node.test, namespace)
            if false is None:
                continue
            check = branches.setdefault((ast.unparse(node.test), false),
                                        Check(namespace, strict=True))
            check.run(node.body if false else node.orelse)
    errors += [e for c in list(branches.values()) + [whole] for e in c.errors]
    return sorted(set(errors))
