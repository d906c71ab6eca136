"""One module per source kind, each registered with :func:`~diagnoser.sources.registry.source_kind`."""
