"""A stand-in for the GCE metadata server of a TPU VM: answers `GET .../<key>` with a value of its table, to
requests that carry GCE's `Metadata-Flavor: Google` header (others: 403), 404 for a key it does not have.

`Handler(values)` is the request handler for an http.server over `values` ({key: text}); as a script,
`python metadata_server.py DIR ADDRESS PORT` serves the files of DIR (one per key) on ADDRESS:PORT until killed.
Run by path: it imports only the standard library.
"""

import http.server
import sys
from pathlib import Path


def Handler(values):
    """A BaseHTTPRequestHandler class serving `values` ({key: text}) as GCE's metadata server does."""

    class MetadataHandler(http.server.BaseHTTPRequestHandler):

        def do_GET(self):
            key = self.path.rsplit("/", 1)[-1]
            if self.headers.get("Metadata-Flavor") != "Google" or key not in values:
                self.send_error(403 if key in values else 404)
                return
            body = values[key].encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    return MetadataHandler


if __name__ == "__main__":
    folder, address, port = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    files = {path.name: path.read_text() for path in folder.iterdir() if path.is_file()}
    http.server.ThreadingHTTPServer((address, port), Handler(files)).serve_forever()
