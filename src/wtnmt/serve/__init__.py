"""`wtnmt serve`: a translation server with dynamic batching, limits, metrics and a web page.

Needs the ``serve`` extra (FastAPI, uvicorn, prometheus-client). Importing this package imports
none of them: ``wtnmt.serve.app`` does.
"""
