"""moto's server, one request at a time, resends of a transaction answered as DynamoDB does.

`moto_server` serves requests on threads, and moto's DynamoDB transactions are not thread-safe:
two concurrent TransactWriteItems race on a deep copy of the table and one fails with HTTP 500
("dictionary changed size during iteration"). DynamoDB itself serializes conflicting
transactions, so a server that handles one request at a time is the faithful choice for tests.

moto ignores a TransactWriteItems' ClientRequestToken. DynamoDB applies a transaction at most
once per token: a resend with the same token and parameters, within ten minutes of a success,
answers that success again without evaluating its conditions (a different request under the
same token is refused with IdempotentParameterMismatchException). Clients resend after a lost
reply with the same token, and count on it: without it, a resend of a write that had applied
finds its own effect, or a later writer's, and is refused, and the client reports a write the
store holds as refused (`palisade torture` found that on a 30-minute Redis x DynamoDB run).
`IdempotentTransactions` below answers resends as DynamoDB does, in front of moto.

usage: python3 moto_serial.py HOST PORT
"""

import hashlib
import io
import json
import sys
import time
from collections import OrderedDict

from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
from werkzeug.serving import WSGIRequestHandler, make_server

# How long DynamoDB honours a client token after the request that used it completed.
TOKEN_WINDOW_S = 600


class Handler(WSGIRequestHandler):
    # One request at a time means a client frozen mid-request (the SIGSTOP tests freeze
    # processes at any instant) would stall every other client forever: give up on a silent
    # connection soon instead. Not after 5 s, as before: the load scenario's calls must answer
    # within 5 s, and a freeze test running beside it stalled them that long. A client on
    # loopback sends a whole request at once, so a second of silence means it is frozen.
    timeout = 1


class IdempotentTransactions:
    """WSGI middleware: TransactWriteItems at most once per ClientRequestToken."""

    def __init__(self, app):
        self.app = app
        # token -> (completed at, digest of the other parameters, status, headers, body)
        self.done = OrderedDict()

    def __call__(self, environ, start_response):
        if not environ.get("HTTP_X_AMZ_TARGET", "").endswith(".TransactWriteItems"):
            return self.app(environ, start_response)
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(length)
        environ["wsgi.input"] = io.BytesIO(body)
        try:
            request = json.loads(body)
        except ValueError:
            return self.app(environ, start_response)
        token = request.pop("ClientRequestToken", None) if isinstance(request, dict) else None
        if not token:
            return self.app(environ, start_response)
        digest = hashlib.sha256(json.dumps(request, sort_keys=True).encode()).hexdigest()
        now = time.monotonic()
        while self.done and now - next(iter(self.done.values()))[0] > TOKEN_WINDOW_S:
            self.done.popitem(last=False)
        seen = self.done.get(token)
        if seen is not None:
            if seen[1] != digest:
                error = json.dumps(
                    {
                        "__type": "com.amazonaws.dynamodb.v20120810#IdempotentParameterMismatchException",
                        "message": "the request's parameters differ from an earlier request with this client token",
                    }
                ).encode()
                start_response(
                    "400 Bad Request",
                    [("Content-Type", "application/x-amz-json-1.0"), ("Content-Length", str(len(error)))],
                )
                return [error]
            start_response(seen[2], seen[3])
            return [seen[4]]
        captured = {}

        def capture(status, headers, exc_info=None):
            captured["status"], captured["headers"] = status, headers
            return start_response(status, headers, exc_info)

        answer = b"".join(self.app(environ, capture))
        if captured.get("status", "").startswith("200"):
            self.done[token] = (time.monotonic(), digest, captured["status"], captured["headers"], answer)
        return [answer]


def main() -> None:
    host, port = sys.argv[1], int(sys.argv[2])
    app = IdempotentTransactions(DomainDispatcherApplication(create_backend_app))
    server = make_server(host, port, app, threaded=False, request_handler=Handler)
    # A deep listen queue: many clients connect at once, and each waits its turn.
    server.socket.listen(1024)
    server.serve_forever()


if __name__ == "__main__":
    main()
