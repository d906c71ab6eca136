"""A gRPC server whose reflection service misbehaves on purpose, run as its own process.

It serves ``grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo`` (v1 answers
UNIMPLEMENTED, as grpcio-reflection's servers do) with hand-built ``FileDescriptorProto``s, and a
unary ``chain.Svc/Get`` that answers an empty ``chain.M``. ``--mode``:

- ``finite``: ``chain/0.proto`` (the service) imports ``chain/1.proto``, which imports
  ``chain/2.proto``: a sane definition of three files;
- ``chain``: every ``chain/N.proto`` imports ``chain/N+1.proto``, for ever;
- ``slow-chain``: the same, each answer 0.25 s late;
- ``wide``: the service's file imports 10,000 files;
- ``garbage-file``: the service's file is bytes that are no ``FileDescriptorProto``;
- ``garbage-message``: the answer is bytes that are no ``ServerReflectionResponse``.

Every reflection request is counted; ``--count-file`` holds the count. Prints ``PORT <n>`` once it
serves on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import descriptor_pb2
from grpc_reflection.v1alpha import reflection_pb2

SERVICE = "chain.Svc"


def _file(index: int, dependencies: list[str]) -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto(
        name=f"chain/{index}.proto", package="chain" if index == 0 else f"chain.n{index}", syntax="proto3"
    )
    proto.dependency.extend(dependencies)
    proto.message_type.add(name="M")
    if index == 0:
        service = proto.service.add(name="Svc")
        service.method.add(name="Get", input_type=".chain.M", output_type=".chain.M")
    return proto


def _dependencies(mode: str, index: int) -> list[str]:
    if mode == "finite":
        return [f"chain/{index + 1}.proto"] if index < 2 else []
    if mode == "wide":
        return [f"wide/{n}.proto" for n in range(10_000)] if index == 0 else []
    return [f"chain/{index + 1}.proto"]


class Reflection:
    def __init__(self, mode: str, count_file: Path | None) -> None:
        self.mode = mode
        self.count_file = count_file
        self.count = 0

    def answer(self, request: Any) -> bytes:
        self.count += 1
        if self.count_file is not None:
            self.count_file.write_text(str(self.count))
        if self.mode == "slow-chain":
            time.sleep(0.25)
        if self.mode == "garbage-message":
            return b"\xff\xfe\xfd not a reflection response"
        response = reflection_pb2.ServerReflectionResponse()
        kind = request.WhichOneof("message_request")
        if kind == "file_containing_symbol" and request.file_containing_symbol == SERVICE:
            index = 0
        elif kind == "file_by_filename" and request.file_by_filename.startswith(("chain/", "wide/")):
            index = int(request.file_by_filename.split("/")[1].split(".")[0])
            if request.file_by_filename.startswith("wide/"):
                index += 100_000  # a leaf of the wide tree
        else:
            response.error_response.error_code = grpc.StatusCode.NOT_FOUND.value[0]
            response.error_response.error_message = "not found"
            return response.SerializeToString()
        if self.mode == "garbage-file" and index == 0:
            response.file_descriptor_response.file_descriptor_proto.append(b"\xff\xff\xff\xff\x0f garbage")
            return response.SerializeToString()
        proto = _file(index, _dependencies(self.mode, index) if index < 100_000 else [])
        if index >= 100_000:
            proto.name = request.file_by_filename
        response.file_descriptor_response.file_descriptor_proto.append(proto.SerializeToString())
        return response.SerializeToString()

    def info(self, requests: Iterator[bytes], context: Any) -> Iterator[bytes]:
        for raw in requests:
            yield self.answer(reflection_pb2.ServerReflectionRequest.FromString(raw))


def serve(mode: str, port: int, count_file: Path | None) -> None:
    reflection = Reflection(mode, count_file)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    handlers = {
        "ServerReflectionInfo": grpc.stream_stream_rpc_method_handler(reflection.info),
    }
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler("grpc.reflection.v1alpha.ServerReflection", handlers),
            grpc.method_handlers_generic_handler(
                SERVICE, {"Get": grpc.unary_unary_rpc_method_handler(lambda request, context: b"")}
            ),
        )
    )
    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    print(f"PORT {bound}", flush=True)
    server.wait_for_termination()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mode", required=True,
                        choices=["finite", "chain", "slow-chain", "wide", "garbage-file", "garbage-message"])  # fmt: skip
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--count-file", type=Path)
    args = parser.parse_args()
    serve(args.mode, args.port, args.count_file)


if __name__ == "__main__":
    main()
