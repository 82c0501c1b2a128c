from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WriteRequest(_message.Message):
    __slots__ = ("timeseries", "metadata")
    TIMESERIES_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    timeseries: _containers.RepeatedCompositeFieldContainer[TimeSeries]
    metadata: _containers.RepeatedCompositeFieldContainer[MetricMetadata]
    def __init__(self, timeseries: _Optional[_Iterable[_Union[TimeSeries, _Mapping]]] = ..., metadata: _Optional[_Iterable[_Union[MetricMetadata, _Mapping]]] = ...) -> None: ...

class TimeSeries(_message.Message):
    __slots__ = ("labels", "samples", "exemplars", "histograms")
    LABELS_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    EXEMPLARS_FIELD_NUMBER: _ClassVar[int]
    HISTOGRAMS_FIELD_NUMBER: _ClassVar[int]
    labels: _containers.RepeatedCompositeFieldContainer[Label]
    samples: _containers.RepeatedCompositeFieldContainer[Sample]
    exemplars: _containers.RepeatedCompositeFieldContainer[Exemplar]
    histograms: _containers.RepeatedCompositeFieldContainer[Histogram]
    def __init__(self, labels: _Optional[_Iterable[_Union[Label, _Mapping]]] = ..., samples: _Optional[_Iterable[_Union[Sample, _Mapping]]] = ..., exemplars: _Optional[_Iterable[_Union[Exemplar, _Mapping]]] = ..., histograms: _Optional[_Iterable[_Union[Histogram, _Mapping]]] = ...) -> None: ...

class Label(_message.Message):
    __slots__ = ("name", "value")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: str
    def __init__(self, name: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...

class Sample(_message.Message):
    __slots__ = ("value", "timestamp")
    VALUE_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    value: float
    timestamp: int
    def __init__(self, value: _Optional[float] = ..., timestamp: _Optional[int] = ...) -> None: ...

class Exemplar(_message.Message):
    __slots__ = ("labels", "value", "timestamp")
    LABELS_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    labels: _containers.RepeatedCompositeFieldContainer[Label]
    value: float
    timestamp: int
    def __init__(self, labels: _Optional[_Iterable[_Union[Label, _Mapping]]] = ..., value: _Optional[float] = ..., timestamp: _Optional[int] = ...) -> None: ...

class MetricMetadata(_message.Message):
    __slots__ = ("type", "metric_family_name", "help", "unit")
    class MetricType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        UNKNOWN: _ClassVar[MetricMetadata.MetricType]
        COUNTER: _ClassVar[MetricMetadata.MetricType]
        GAUGE: _ClassVar[MetricMetadata.MetricType]
        HISTOGRAM: _ClassVar[MetricMetadata.MetricType]
        GAUGEHISTOGRAM: _ClassVar[MetricMetadata.MetricType]
        SUMMARY: _ClassVar[MetricMetadata.MetricType]
        INFO: _ClassVar[MetricMetadata.MetricType]
        STATESET: _ClassVar[MetricMetadata.MetricType]
    UNKNOWN: MetricMetadata.MetricType
    COUNTER: MetricMetadata.MetricType
    GAUGE: MetricMetadata.MetricType
    HISTOGRAM: MetricMetadata.MetricType
    GAUGEHISTOGRAM: MetricMetadata.MetricType
    SUMMARY: MetricMetadata.MetricType
    INFO: MetricMetadata.MetricType
    STATESET: MetricMetadata.MetricType
    TYPE_FIELD_NUMBER: _ClassVar[int]
    METRIC_FAMILY_NAME_FIELD_NUMBER: _ClassVar[int]
    HELP_FIELD_NUMBER: _ClassVar[int]
    UNIT_FIELD_NUMBER: _ClassVar[int]
    type: MetricMetadata.MetricType
    metric_family_name: str
    help: str
    unit: str
    def __init__(self, type: _Optional[_Union[MetricMetadata.MetricType, str]] = ..., metric_family_name: _Optional[str] = ..., help: _Optional[str] = ..., unit: _Optional[str] = ...) -> None: ...

class Histogram(_message.Message):
    __slots__ = ("count_int", "count_float", "sum", "schema", "zero_threshold", "zero_count_int", "zero_count_float", "negative_spans", "negative_deltas", "negative_counts", "positive_spans", "positive_deltas", "positive_counts", "reset_hint", "timestamp", "custom_values")
    class ResetHint(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        UNKNOWN: _ClassVar[Histogram.ResetHint]
        YES: _ClassVar[Histogram.ResetHint]
        NO: _ClassVar[Histogram.ResetHint]
        GAUGE: _ClassVar[Histogram.ResetHint]
    UNKNOWN: Histogram.ResetHint
    YES: Histogram.ResetHint
    NO: Histogram.ResetHint
    GAUGE: Histogram.ResetHint
    COUNT_INT_FIELD_NUMBER: _ClassVar[int]
    COUNT_FLOAT_FIELD_NUMBER: _ClassVar[int]
    SUM_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_FIELD_NUMBER: _ClassVar[int]
    ZERO_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    ZERO_COUNT_INT_FIELD_NUMBER: _ClassVar[int]
    ZERO_COUNT_FLOAT_FIELD_NUMBER: _ClassVar[int]
    NEGATIVE_SPANS_FIELD_NUMBER: _ClassVar[int]
    NEGATIVE_DELTAS_FIELD_NUMBER: _ClassVar[int]
    NEGATIVE_COUNTS_FIELD_NUMBER: _ClassVar[int]
    POSITIVE_SPANS_FIELD_NUMBER: _ClassVar[int]
    POSITIVE_DELTAS_FIELD_NUMBER: _ClassVar[int]
    POSITIVE_COUNTS_FIELD_NUMBER: _ClassVar[int]
    RESET_HINT_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    CUSTOM_VALUES_FIELD_NUMBER: _ClassVar[int]
    count_int: int
    count_float: float
    sum: float
    schema: int
    zero_threshold: float
    zero_count_int: int
    zero_count_float: float
    negative_spans: _containers.RepeatedCompositeFieldContainer[BucketSpan]
    negative_deltas: _containers.RepeatedScalarFieldContainer[int]
    negative_counts: _containers.RepeatedScalarFieldContainer[float]
    positive_spans: _containers.RepeatedCompositeFieldContainer[BucketSpan]
    positive_deltas: _containers.RepeatedScalarFieldContainer[int]
    positive_counts: _containers.RepeatedScalarFieldContainer[float]
    reset_hint: Histogram.ResetHint
    timestamp: int
    custom_values: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, count_int: _Optional[int] = ..., count_float: _Optional[float] = ..., sum: _Optional[float] = ..., schema: _Optional[int] = ..., zero_threshold: _Optional[float] = ..., zero_count_int: _Optional[int] = ..., zero_count_float: _Optional[float] = ..., negative_spans: _Optional[_Iterable[_Union[BucketSpan, _Mapping]]] = ..., negative_deltas: _Optional[_Iterable[int]] = ..., negative_counts: _Optional[_Iterable[float]] = ..., positive_spans: _Optional[_Iterable[_Union[BucketSpan, _Mapping]]] = ..., positive_deltas: _Optional[_Iterable[int]] = ..., positive_counts: _Optional[_Iterable[float]] = ..., reset_hint: _Optional[_Union[Histogram.ResetHint, str]] = ..., timestamp: _Optional[int] = ..., custom_values: _Optional[_Iterable[float]] = ...) -> None: ...

class BucketSpan(_message.Message):
    __slots__ = ("offset", "length")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    offset: int
    length: int
    def __init__(self, offset: _Optional[int] = ..., length: _Optional[int] = ...) -> None: ...
