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

moto backs up a TransactWriteItems by deep-copying the whole table once per item of the
transaction, to put it back if the transaction is cancelled: the cost of every transaction grows
with the table, and 30-minute `palisade torture` runs against DynamoDB grew moto to 6-9 GB and
ran the machine out of memory. `undo_per_item` below backs up only the items the transaction
names, and puts those back instead.

moto's Scan sorts the whole table by its keys on every page (comparing them as moto's own
types, slowly), deep-copies every item it reads, and only then applies the filter: the cost of
every page grows with the table. `scan_in_key_order` below sorts plain key values, starts at the
page's first key by bisection and copies only the items the filter keeps; its pages end where
DynamoDB's do (`Limit` items or 1 MB read, filtered out or not). Listing 8,500 audit rows of a
17,000-item table (two pages) took 5.2 s before, 4.6 s with it, on an idle machine; the page
that keeps few items, 0.5 s before and 0.1 s with it. Most of what is left is moto writing out
the items a page keeps.

usage: python3 moto_serial.py HOST PORT
"""

import bisect
import copy
import hashlib
import io
import json
import sys
import time
from collections import OrderedDict

import moto.dynamodb.models as dynamodb_models
from moto.dynamodb.models.dynamo_type import DynamoType
from moto.dynamodb.models.table import RESULT_SIZE_LIMIT, Table
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


class _CopiesButTables:
    """`copy` as moto's DynamoDB backend sees it: everything deep-copied as ever, except a
    table, which comes back as itself (its backup is `undo_per_item`'s)."""

    @staticmethod
    def deepcopy(value, memo=None):
        return value if isinstance(value, Table) else copy.deepcopy(value, memo)


def _item_slot(backend, entry):
    """(table, hash key, range key) of one TransactWriteItems entry, or None if moto will
    refuse it anyway (an unknown table, a missing key)."""
    try:
        op_type, op = next(iter(entry.items()))
        table = backend.tables[op["TableName"]]
        key = op["Item"] if op_type == "Put" else op["Key"]
        hash_key = DynamoType(key[table.hash_key_attr])
        range_key = DynamoType(key[table.range_key_attr]) if table.range_key_attr is not None else None
        return table, hash_key, range_key
    except (KeyError, TypeError, StopIteration, AttributeError):
        return None


def _put_back(table, hash_key, range_key, item):
    if range_key is None:
        if item is None:
            table.items.pop(hash_key, None)
        else:
            table.items[hash_key] = item
    else:
        if item is None:
            table.items.get(hash_key, {}).pop(range_key, None)
        else:
            table.items[hash_key][range_key] = item


def undo_per_item():
    """Makes moto back up the items a TransactWriteItems names, not its whole tables."""
    transact = dynamodb_models.DynamoDBBackend.transact_write_items

    def transact_write_items(self, transact_items):
        backup = []
        for entry in transact_items if isinstance(transact_items, list) else []:
            slot = _item_slot(self, entry)
            if slot is not None:
                table, hash_key, range_key = slot
                before = table.items.get(hash_key)
                if range_key is not None:
                    before = before.get(range_key) if before else None
                backup.append((table, hash_key, range_key, copy.deepcopy(before)))
        try:
            return transact(self, transact_items)
        except Exception:
            # Cancelled: every item as it was (in reverse, so an item named twice ends as it
            # was first).
            for table, hash_key, range_key, item in reversed(backup):
                _put_back(table, hash_key, range_key, item)
            raise

    dynamodb_models.copy = _CopiesButTables
    dynamodb_models.DynamoDBBackend.transact_write_items = transact_write_items


def _key_value(key):
    """A hash key as moto orders it (`DynamoType.__lt__` compares `cast_value`), but as a
    plain value: sorting 20,000 keys then takes milliseconds, not seconds."""
    return key.cast_value


def scan_in_key_order():
    """Makes moto's Scan of a table (no index, no sort key, no segments, no legacy ScanFilter)
    cost a sort of plain keys and the page it reads, not a walk of the table."""
    scan = Table.scan

    def table_scan(
        self,
        filters,
        limit,
        exclusive_start_key,
        filter_expression=None,
        index_name=None,
        consistent_read=False,
        projection_expression=None,
        segments=(None, None),
    ):
        if index_name or filters or self.range_key_attr is not None or segments != (None, None):
            return scan(
                self,
                filters,
                limit,
                exclusive_start_key,
                filter_expression,
                index_name,
                consistent_read,
                projection_expression,
                segments=segments,
            )
        keys = sorted(self.items, key=_key_value)
        first = 0
        if exclusive_start_key:
            after = _key_value(DynamoType(exclusive_start_key[self.hash_key_attr]))
            first = bisect.bisect_right(keys, after, key=_key_value)
        results, read, scanned, last = [], 0, 0, None
        for hash_key in keys[first:]:
            item = self.items[hash_key]
            # A page ends at `Limit` items read or 1 MB read, filtered out or not, as DynamoDB's
            # does; its LastEvaluatedKey is the last item read.
            size = item.size()
            if scanned == limit or read + size > RESULT_SIZE_LIMIT:
                return _page(results, scanned, {self.hash_key_attr: last.hash_key}, projection_expression)
            read += size
            scanned += 1
            last = item
            if filter_expression is None or filter_expression.expr(item):
                results.append(copy.deepcopy(item))
        return _page(results, scanned, None, projection_expression)

    Table.scan = table_scan


def _page(results, scanned, last_evaluated_key, projection_expression):
    if projection_expression:
        results = [r.project(projection_expression) for r in results]
    return results, scanned, last_evaluated_key


def main() -> None:
    undo_per_item()
    scan_in_key_order()
    host, port = sys.argv[1], int(sys.argv[2])
    app = IdempotentTransactions(DomainDispatcherApplication(create_backend_app))
    server = make_server(host, port, app, threaded=False, request_handler=Handler)
    # A deep listen queue: many clients connect at once, and each waits its turn.
    server.socket.listen(1024)
    server.serve_forever()


if __name__ == "__main__":
    main()
