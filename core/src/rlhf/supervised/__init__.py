"""The supervised trainers' shared machinery: the trainer base, its chosen/rejected variant, batches and models."""
