"""What the server's routes share, whatever protocol they speak: the model being served
(None while it loads) and the request counters behind /metrics and the app's panel."""

from engine.server.completions import ServedModel
from engine.server.errors import APIError
from engine.server.metrics import ServerMetrics


class ServerState:
    """What the routes serve: the model (None while loading) and the request counters."""

    def __init__(self, served: ServedModel | None = None):
        self.served = served
        self.metrics = ServerMetrics(lambda: self.served.scheduler if self.served else None)
        self.requests_total = 0  # generation requests received (the app's panel shows it)

    def require(self) -> ServedModel:
        """The served model, or APIError 503 while it loads."""
        served = self.served
        if served is None:
            raise APIError(
                503, "The model is still loading; retry shortly.", code="model_loading", headers={"Retry-After": "5"}
            )
        return served
