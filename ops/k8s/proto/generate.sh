#!/bin/sh
# Regenerates the committed Python modules from the .proto files beside this script.
# Needs grpcio-tools (pip install grpcio-tools); run from anywhere. The generated code is committed so
# that installing gpuwarden needs neither protoc nor grpcio-tools; its protobuf runtime check sets the
# floor on `protobuf` in pyproject.toml.
set -eu
cd "$(dirname "$0")/../../.."
python -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. \
    ops/k8s/proto/podresources.proto ops/k8s/proto/metricssvc.proto
