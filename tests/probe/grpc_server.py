"""A real grpcio feature service for the probe's gRPC tests and bench, run in its own process.

``protos/features.proto`` is compiled when it starts (grpcio-tools, into a temporary directory)
and served on a grpc.aio server on 127.0.0.1:

- ``features.v1.Features/Get`` takes 10 ms (or the request's ``delay_ms``) and answers a known
  user (``u...``) with a features map, an unknown one with an empty map (a success with nothing
  in it), and the user ``unavailable`` with ``UNAVAILABLE`` (load shedding on demand);
- ``features.v1.Control/Stats`` and ``/Reset``: the server's own service time (handler entry to
  answer) as percentiles, which the bench compares the probe's latency with;
- server reflection as asked: ``--reflection both`` (v1 and v1alpha, the default), ``v1``,
  ``v1alpha`` or ``none``;
- ``--limit N``: at most N calls handled at once (an asyncio semaphore); others wait their turn,
  so past N / 10 ms per second the latency climbs: a known knee for ``diagnose capacity``.

Prints ``PORT <n>`` once it serves.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
from grpc_reflection.v1alpha import reflection, reflection_pb2
from grpc_tools import protoc

PROTO_DIR = Path(__file__).with_name("protos")


def compile_features(out: Path) -> tuple[Any, Any, Any]:
    """``features_pb2``, ``features_pb2_grpc`` and ``empty_pb2``, generated into ``out``."""
    well_known = Path(protoc.__file__).parent / "_proto"
    code = protoc.main(
        ["protoc", f"-I{PROTO_DIR}", f"-I{well_known}", f"--python_out={out}", f"--grpc_python_out={out}",
         str(PROTO_DIR / "features.proto")]
    )  # fmt: skip
    if code != 0:
        raise SystemExit(f"features.proto does not compile ({code})")
    sys.path.insert(0, str(out))
    from google.protobuf import empty_pb2

    return importlib.import_module("features_pb2"), importlib.import_module("features_pb2_grpc"), empty_pb2


class FeatureService:
    def __init__(self, pb: Any, limit: int | None) -> None:
        self.pb = pb
        self.limit = asyncio.Semaphore(limit) if limit else None
        self.durations: list[float] = []
        self.unavailable = 0
        self.last_tenant = ""

    async def Get(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        started = time.monotonic()
        self.last_tenant = dict(context.invocation_metadata() or ()).get("x-tenant", "")
        if self.limit is not None:
            async with self.limit:
                return await self._answer(request, context, started)
        return await self._answer(request, context, started)

    async def _answer(self, request: Any, context: grpc.aio.ServicerContext[Any, Any], started: float) -> Any:
        await asyncio.sleep((request.delay_ms or 10) / 1000)
        self.durations.append(time.monotonic() - started)
        if request.user_id == "unavailable":
            self.unavailable += 1
            await context.abort(grpc.StatusCode.UNAVAILABLE, "shedding load")
        if request.user_id.startswith("u"):
            return self.pb.GetFeaturesResponse(features={"ctr": 0.12, "score": 0.9})
        return self.pb.GetFeaturesResponse()

    async def Watch(self, request: Any, context: Any) -> Any:
        yield self.pb.GetFeaturesResponse()


class ControlService:
    def __init__(self, pb: Any, empty: Any, features: FeatureService) -> None:
        self.pb, self.empty, self.features = pb, empty, features

    async def Stats(self, request: Any, context: Any) -> Any:
        values = sorted(self.features.durations)

        def at(share: float) -> float:
            return values[min(len(values) - 1, int(share * len(values)))] * 1000 if values else 0.0

        return self.pb.ServerStats(
            count=len(values),
            p50_ms=at(0.5),
            p99_ms=at(0.99),
            unavailable=self.features.unavailable,
            last_tenant=self.features.last_tenant,
        )

    async def Reset(self, request: Any, context: Any) -> Any:
        self.features.durations.clear()
        self.features.unavailable = 0
        self.features.last_tenant = ""
        return self.empty.Empty()


def _enable_reflection(server: grpc.aio.Server, names: list[str], versions: str) -> None:
    if versions == "none":
        return
    names = [*names, reflection.SERVICE_NAME]
    if versions in ("both", "v1alpha"):
        reflection.enable_server_reflection(names, server)
    if versions in ("both", "v1"):
        # grpcio-reflection serves v1alpha only; v1 is the same messages under another name.
        servicer = reflection.aio.ReflectionServicer(names)
        handler = grpc.method_handlers_generic_handler(
            "grpc.reflection.v1.ServerReflection",
            {
                "ServerReflectionInfo": grpc.stream_stream_rpc_method_handler(
                    servicer.ServerReflectionInfo,
                    request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
                    response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
                )
            },
        )
        server.add_generic_rpc_handlers((handler,))


async def serve(args: argparse.Namespace, tls: tuple[bytes, bytes] | None) -> None:
    with tempfile.TemporaryDirectory(prefix="features-proto-") as out:
        pb, pb_grpc, empty = compile_features(Path(out))
        server = grpc.aio.server()
        features = FeatureService(pb, args.limit)
        pb_grpc.add_FeaturesServicer_to_server(features, server)
        pb_grpc.add_ControlServicer_to_server(ControlService(pb, empty, features), server)
        names = [pb.DESCRIPTOR.services_by_name[n].full_name for n in ("Features", "Control")]
        _enable_reflection(server, names, args.reflection)
        if tls is not None:
            cert, key = tls
            port = server.add_secure_port(f"127.0.0.1:{args.port}", grpc.ssl_server_credentials([(key, cert)]))
        else:
            port = server.add_insecure_port(f"127.0.0.1:{args.port}")
        await server.start()
        print(f"PORT {port}", flush=True)
        await server.wait_for_termination()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--reflection", choices=["both", "v1", "v1alpha", "none"], default="both")
    parser.add_argument("--limit", type=int, default=None, help="calls handled at once")
    parser.add_argument("--tls", nargs=2, metavar=("CERT", "KEY"))
    args = parser.parse_args()
    tls = (Path(args.tls[0]).read_bytes(), Path(args.tls[1]).read_bytes()) if args.tls else None
    asyncio.run(serve(args, tls))


if __name__ == "__main__":
    main()
