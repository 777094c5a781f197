"""An OTLP/HTTP receiver for the observability test (tests/observability.rs).

It decodes what the gateway sends with the official OTLP protobuf
definitions (PyPI opentelemetry-proto), never with the gateway's own code:
  POST /v1/traces  spans, one JSON object a line in OUT/spans.jsonl
  POST /v1/logs    the audit export's log records: each body (a record's
                   JSON) a line in OUT/export.jsonl
  POST /ingest     the JSON-lines sink: the lines as they came, in
                   OUT/export-jsonl.jsonl (Authorization: Bearer TOKEN
                   required when --token is given)
What it stores is on disk (fsync) before it answers 200: an answer the
gateway took as an acknowledgement is never lost when the receiver is
killed. Usage: receiver.py PORT OUT [--token TOKEN]
"""

import json
import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

PORT = int(sys.argv[1])
OUT = sys.argv[2]
TOKEN = sys.argv[sys.argv.index("--token") + 1] if "--token" in sys.argv else None


def value(v):
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


def append(name, lines):
    with open(os.path.join(OUT, name), "a", encoding="utf-8") as f:
        for line in lines:
            f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def answer(self, status, body=b"", content_type="application/x-protobuf"):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.path == "/v1/traces":
            req = trace_service_pb2.ExportTraceServiceRequest()
            req.ParseFromString(body)
            spans = []
            for rs in req.resource_spans:
                service = {a.key: value(a.value) for a in rs.resource.attributes}.get("service.name")
                for ss in rs.scope_spans:
                    for s in ss.spans:
                        spans.append(json.dumps({
                            "service": service,
                            "trace_id": s.trace_id.hex(),
                            "span_id": s.span_id.hex(),
                            "parent_span_id": s.parent_span_id.hex(),
                            "name": s.name,
                            "kind": s.kind,
                            "start": s.start_time_unix_nano,
                            "end": s.end_time_unix_nano,
                            "attributes": {a.key: value(a.value) for a in s.attributes},
                            "events": [{"name": e.name, "time": e.time_unix_nano} for e in s.events],
                        }))
            append("spans.jsonl", spans)
            self.answer(200, trace_service_pb2.ExportTraceServiceResponse().SerializeToString())
        elif self.path == "/v1/logs":
            req = logs_service_pb2.ExportLogsServiceRequest()
            req.ParseFromString(body)
            bodies = []
            for rl in req.resource_logs:
                for sl in rl.scope_logs:
                    for r in sl.log_records:
                        attrs = {a.key: value(a.value) for a in r.attributes}
                        record = json.loads(value(r.body))
                        # The attributes say what the body says.
                        assert attrs["gateway.audit.seq"] == record["seq"], (attrs, record)
                        assert attrs["gateway.audit.kind"] == record["kind"], (attrs, record)
                        bodies.append(value(r.body))
            append("export.jsonl", bodies)
            self.answer(200, logs_service_pb2.ExportLogsServiceResponse().SerializeToString())
        elif self.path == "/ingest":
            if TOKEN is not None and self.headers.get("Authorization") != "Bearer " + TOKEN:
                self.answer(401, b"bad token\n", "text/plain")
                return
            append("export-jsonl.jsonl", [l for l in body.decode("utf-8").splitlines() if l])
            self.answer(200, b"ok\n", "text/plain")
        else:
            self.answer(404, b"not found\n", "text/plain")


ThreadingHTTPServer.allow_reuse_address = True
ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
