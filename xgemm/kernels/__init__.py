"""One file per kernel. Each opens with its contract: dtypes, majorness, alignment, arch, limits."""
