"""moto's server, one request at a time.

`moto_server` serves requests on threads, and moto's DynamoDB transactions are not thread-safe:
two concurrent TransactWriteItems race on a deep copy of the table and one fails with HTTP 500
("dictionary changed size during iteration"). DynamoDB itself serializes conflicting
transactions, so a server that handles one request at a time is the faithful choice for tests.

usage: python3 moto_serial.py HOST PORT
"""

import sys

from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
from werkzeug.serving import WSGIRequestHandler, make_server


class Handler(WSGIRequestHandler):
    # One request at a time means a client frozen mid-request (the SIGSTOP tests freeze
    # processes at any instant) would stall every other client forever: give up on a silent
    # connection soon instead. Not after 5 s, as before: the load scenario's calls must answer
    # within 5 s, and a freeze test running beside it stalled them that long. A client on
    # loopback sends a whole request at once, so a second of silence means it is frozen.
    timeout = 1


def main() -> None:
    host, port = sys.argv[1], int(sys.argv[2])
    app = DomainDispatcherApplication(create_backend_app)
    server = make_server(host, port, app, threaded=False, request_handler=Handler)
    # A deep listen queue: many clients connect at once, and each waits its turn.
    server.socket.listen(1024)
    server.serve_forever()


if __name__ == "__main__":
    main()
