"""Built for an older rlhf-core (its range excludes this one); never imported: the range is checked first."""

raise RuntimeError("an incompatible plugin must not be imported")
