"""The browser test console's files, served on the voice port: ``GET /`` is the page,
``GET /static/<name>`` its assets, read from gateway/static/ (no build step).

``static_response(path)`` returns a ``Response``, or None when ``path`` names none of these
files (the caller answers its JSON 404, as for any other path). Only flat file names with a
known type are served, so ``..`` cannot leave the folder.
"""

from __future__ import annotations

import http
from pathlib import Path

from websockets.datastructures import Headers
from websockets.http11 import Response

STATIC_DIR = Path(__file__).resolve().parent.parent / "static"
CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".ico": "image/x-icon",
}


def static_response(path: str, root: Path = STATIC_DIR) -> Response | None:
    if path == "/":
        name = "index.html"
    elif path.startswith("/static/"):
        name = path.removeprefix("/static/")
    else:
        return None
    kind = CONTENT_TYPES.get(Path(name).suffix)
    file = root / name
    if "/" in name or "\\" in name or name.startswith(".") or kind is None or not file.is_file():
        return None
    body = file.read_bytes()
    headers = Headers([("Content-Type", kind), ("Content-Length", str(len(body))),
                       ("Cache-Control", "no-cache"), ("X-Content-Type-Options", "nosniff")])
    return Response(http.HTTPStatus.OK.value, http.HTTPStatus.OK.phrase, headers, body)
