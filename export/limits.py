"""Defaults of the export that its command line shows: kept free of torch and onnx so that
`edgeseq export --help` and `edgeseq verify --help` work on a torch-free install."""

LEVEL3_MIN_INPUTS = 200  # held-out inputs of parity level 3 and of the variants' gates
DEFAULT_MAX_METRIC_DROP = 0.5  # largest drop of the task metric vs fp32, percentage points
