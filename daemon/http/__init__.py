"""The HTTP side: the API, its OpenAPI description, the event stream, metrics."""
