#!/bin/sh
# Regenerates the committed Python modules, and their type stubs, from the .proto files beside this script.
# Needs grpcio-tools and mypy-protobuf (pip install grpcio-tools mypy-protobuf); run from anywhere. The
# generated code is committed so that installing gpuwarden needs neither protoc nor grpcio-tools; its
# protobuf runtime check sets the floor on `protobuf` in pyproject.toml. The stubs (.pyi: protoc's for the
# messages, mypy-protobuf's for the services) are what mypy reads: the modules build their classes at run time.
set -eu
cd "$(dirname "$0")/../../.."
python -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. --pyi_out=. --mypy_grpc_out=. \
    ops/k8s/proto/podresources.proto ops/k8s/proto/metricssvc.proto
# protoc names modules after their path from the repository root (ops.k8s.proto...); they install as gpuwarden.ops.
sed -i -e "s/^from ops\.k8s\.proto import/from gpuwarden.ops.k8s.proto import/" \
    -e "s/, 'ops\.k8s\.proto\./, 'gpuwarden.ops.k8s.proto./" \
    ops/k8s/proto/*_pb2.py ops/k8s/proto/*_pb2_grpc.py ops/k8s/proto/*.pyi
