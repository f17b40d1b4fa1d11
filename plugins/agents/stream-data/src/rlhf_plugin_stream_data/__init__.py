"""``stream``: prompt rows read by position from JSONL, Parquet or a saved dataset, never loaded whole.

``--data.prompt_source stream --stream.path tasks.jsonl`` hands each step the rows at its positions, read from the
file when they are needed: a taskset of millions of rows costs an index of its line offsets (JSONL), one row group
at a time (Parquet) or the memory map ``datasets`` already keeps (a ``save_to_disk`` folder), never the whole
file. Each episode walks the rows in an order shuffled by the run's seed and the episode, so a resumed run reads the
rows the straight one would have.
"""

import rlhf

rlhf_plugin_api = 3  # the lowest plugin API this plugin needs (docs/plugin-api.md)


@rlhf.hookimpl
def rlhf_register_prompt_sources(register):
    register("stream", "rlhf_plugin_stream_data.source:StreamedRows",
             description="rows read by position from JSONL, Parquet or a saved dataset, never loaded whole")


@rlhf.hookimpl
def rlhf_register_options(register):
    register("rlhf_plugin_stream_data.source:StreamOptions", namespace="stream")
