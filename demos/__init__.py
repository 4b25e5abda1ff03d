"""Applications built on splitinfer (``splitinfer demo``)."""
