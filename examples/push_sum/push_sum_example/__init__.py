"""Push-sum over Flower: ServerApp (coordinator) and ClientApp (one node per SuperNode)."""

__all__: list[str] = []
