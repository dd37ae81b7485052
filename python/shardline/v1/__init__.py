"""Generated protobuf and gRPC modules of proto/shardline/v1/*.proto (shardline.v1.<file>_pb2,
shardline.v1.<file>_pb2_grpc). Not committed: python/generate_stubs.sh, `pip install ./python`
or `bazel build //python:shardline` generate them."""
