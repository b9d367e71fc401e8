"""minichain.serializers: save and load links, optimizers and trainers.

``save_npz(path, obj)`` / ``load_npz(path, obj)`` work for any object with a
``serialize(serializer)`` method (see ``base`` for the protocol).
"""
from minichain.serializers.base import (AbstractSerializer,  # noqa: F401
                                        Deserializer, Serializer)
from minichain.serializers.npz import (DictionarySerializer,  # noqa: F401
                                       NpzDeserializer, atomic_write,
                                       load_npz, save_npz)
