"""Transport adapters: each turns one I/O library into :class:`proxy.shell.endpoint.Endpoint`
objects."""
