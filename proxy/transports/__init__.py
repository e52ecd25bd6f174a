"""Transport adapters: each turns one I/O library into :class:`proxy.endpoint.Endpoint` objects."""
