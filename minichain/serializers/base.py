"""The serializer protocol shared by every format (Chainer's).

A serializer ``s`` walks an object tree: ``s[key]`` is the serializer of a
child, ``value = s(key, value)`` handles one entry. Objects implement
``serialize(s)`` once, with assignments such as ``self.t = s('t', self.t)``,
and that one method both saves and loads:

- a ``Serializer`` records ``value`` and returns it unchanged;
- a ``Deserializer`` returns the stored value, copied into ``value`` in place
  when ``value`` is an array, or converted to ``value``'s type when it is a
  scalar, or as stored when ``value`` is None.

``isinstance(s, Deserializer)`` tells an object which way it is going.
"""

__all__ = ['AbstractSerializer', 'Serializer', 'Deserializer']


class AbstractSerializer:
    """Base of Serializer and Deserializer: ``s[key]`` and ``s(key, value)``.

    Attributes:
        path: the prefix of this serializer's keys (``'model/l1/'``).
    """

    path = ''

    def __getitem__(self, key):
        """The serializer for the child ``key`` (subclasses)."""
        raise NotImplementedError(type(self).__name__ + '.__getitem__')

    def __call__(self, key, value):
        """Save or load the entry ``key`` (subclasses)."""
        raise NotImplementedError(type(self).__name__ + '.__call__')


class Serializer(AbstractSerializer):
    """A serializer that saves."""

    def save(self, obj):
        """Record ``obj`` by calling ``obj.serialize(self)``."""
        obj.serialize(self)


class Deserializer(AbstractSerializer):
    """A serializer that loads."""

    def load(self, obj):
        """Restore ``obj`` by calling ``obj.serialize(self)``.

        A format that checks that every stored key was read (npz with
        ``strict``) learns from ``skip`` which ones are left on purpose.
        """
        obj.serialize(self)

    def children(self):
        """Sorted names of the stored children under this serializer's path
        (``'LogReport'`` for the key ``'extensions/LogReport/_log'`` seen
        from ``s['extensions']``); none by default."""
        return []

    def skip(self):
        """Mark every stored key under this path as deliberately not read
        (nothing to do by default)."""
