"""The ptars parsers of the remote-write receiver (:mod:`pipelines.sources.remote_write`), each
built once per process from a protobuf descriptor: a ``WriteRequest`` trimmed to what lands, and
a request's shape alone, for counting its entries before a full parse."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool

from pipelines.sources import remote_write_pb2 as pb

__all__ = ["request_parser", "shape_parser"]

_handler_lock = threading.Lock()
_handlers: dict[str, Any] = {}


def _handler(message: str, proto: Callable[[], descriptor_pb2.FileDescriptorProto]) -> Any:
    """A ptars parser for ``message`` of the file ``proto()`` describes, built once per process."""
    with _handler_lock:
        if message not in _handlers:
            from ptars import HandlerPool

            pool = descriptor_pool.DescriptorPool()
            built = proto()
            pool.Add(built)
            files = [pool.FindFileByName(built.name)]
            _handlers[message] = HandlerPool(files).get_for_message(pool.FindMessageTypeByName(message))
        return _handlers[message]


def request_parser() -> Any:
    """A ptars parser for a WriteRequest that reads only what is returned: the series' labels and
    samples. Every field ptars knows costs it a builder on every call, so the full message
    (exemplars, native histograms, metadata) costs about 280 us per request however small, more
    than the parse of a request of 2,000 samples; the other fields are skipped as unknown."""
    return _handler("prometheus.WriteRequest", _read_proto)


def _read_proto() -> descriptor_pb2.FileDescriptorProto:
    keep = {"WriteRequest": {"timeseries"}, "TimeSeries": {"labels", "samples"}, "Label": None, "Sample": None}
    full = descriptor_pb2.FileDescriptorProto()
    pb.WriteRequest.DESCRIPTOR.file.CopyToProto(full)
    proto = descriptor_pb2.FileDescriptorProto(
        name="medallion_remote_write_read.proto", package=full.package, syntax=full.syntax
    )
    for message in full.message_type:
        if message.name in keep:
            kept = proto.message_type.add()
            kept.CopyFrom(message)
            fields = keep[message.name]
            if fields is not None:
                del kept.field[:]
                kept.field.extend(f for f in message.field if f.name in fields)
    return proto


def shape_parser() -> Any:
    """A ptars parser for a WriteRequest's shape only: each series as its lists of labels and
    samples, each entry an empty message (its fields skipped as unknown), so nothing is copied."""
    return _handler("medallion.shape.Request", _shape_proto)


def _shape_proto() -> descriptor_pb2.FileDescriptorProto:
    field = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(
        name="medallion_remote_write_shape.proto", package="medallion.shape", syntax="proto3"
    )
    proto.message_type.add(name="Entry")
    series = proto.message_type.add(name="Series")
    request = proto.message_type.add(name="Request")
    for message, name, number, entry in (
        (series, "labels", 1, ".medallion.shape.Entry"),
        (series, "samples", 2, ".medallion.shape.Entry"),
        (request, "timeseries", 1, ".medallion.shape.Series"),
    ):
        message.field.add(
            name=name, number=number, type=field.TYPE_MESSAGE, label=field.LABEL_REPEATED, type_name=entry
        )
    return proto
