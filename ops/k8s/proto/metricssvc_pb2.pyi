from google.protobuf import empty_pb2 as _empty_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GPUHealth(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    UNKNOWN: _ClassVar[GPUHealth]
    HEALTHY: _ClassVar[GPUHealth]
    UNHEALTHY: _ClassVar[GPUHealth]
UNKNOWN: GPUHealth
HEALTHY: GPUHealth
UNHEALTHY: GPUHealth

class GPUState(_message.Message):
    __slots__ = ("ID", "UUID", "Health", "AssociatedWorkload", "Device")
    ID_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    HEALTH_FIELD_NUMBER: _ClassVar[int]
    ASSOCIATEDWORKLOAD_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    ID: str
    UUID: str
    Health: str
    AssociatedWorkload: _containers.RepeatedScalarFieldContainer[str]
    Device: str
    def __init__(self, ID: _Optional[str] = ..., UUID: _Optional[str] = ..., Health: _Optional[str] = ..., AssociatedWorkload: _Optional[_Iterable[str]] = ..., Device: _Optional[str] = ...) -> None: ...

class GPUGetRequest(_message.Message):
    __slots__ = ("ID",)
    ID_FIELD_NUMBER: _ClassVar[int]
    ID: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, ID: _Optional[_Iterable[str]] = ...) -> None: ...

class GPUUpdateRequest(_message.Message):
    __slots__ = ("ID", "Health")
    ID_FIELD_NUMBER: _ClassVar[int]
    HEALTH_FIELD_NUMBER: _ClassVar[int]
    ID: _containers.RepeatedScalarFieldContainer[str]
    Health: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, ID: _Optional[_Iterable[str]] = ..., Health: _Optional[_Iterable[str]] = ...) -> None: ...

class GPUStateResponse(_message.Message):
    __slots__ = ("GPUState",)
    GPUSTATE_FIELD_NUMBER: _ClassVar[int]
    GPUState: _containers.RepeatedCompositeFieldContainer[GPUState]
    def __init__(self, GPUState: _Optional[_Iterable[_Union[GPUState, _Mapping]]] = ...) -> None: ...
