"""Chainer's ``chainer.serializer`` path: the base classes of the serializer
protocol, which :mod:`minichain.serializers.base` defines."""
from minichain.serializers.base import (  # noqa: F401
    AbstractSerializer, Deserializer, Serializer)

__all__ = ['AbstractSerializer', 'Deserializer', 'Serializer']
