"""Generated gRPC modules (see generate.sh) for the kubelet pod-resources API and AMD's GPU health service."""
