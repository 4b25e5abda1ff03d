"""splitinfer.edge — see docs/architecture.md; built in a later issue."""

__all__: list[str] = []
