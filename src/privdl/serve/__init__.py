"""``privdl serve``: the accountant as a local web page (docs/serve.md).

:mod:`privdl.serve.compute` holds the numbers (the CLI's own JSON objects), :mod:`privdl.serve.jobs`
runs them one at a time with progress and cancellation, :mod:`privdl.serve.app` is the HTTP
server (the standard library's ``ThreadingHTTPServer``) and its page ships in
``privdl/resources/serve``.
"""
