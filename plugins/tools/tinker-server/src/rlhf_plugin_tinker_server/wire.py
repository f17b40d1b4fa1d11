"""The binary half of the Tinker protocol: ``forward_backward`` requests arrive, and its outputs and sampling
results leave, as protobuf messages of the SDK's own schema (``tinker.proto.tinker_public_pb2``).

Everything else the SDK sends is JSON. The schema module is the protocol's definition, so the server reads and
writes with it rather than with a copy; it is imported when a message is first handled, not at plugin load.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

PROTO_CONTENT_TYPE = "application/x-protobuf"

#: What a loss reads from a datum, by field name: token ids are whole numbers, everything else a float
TOKEN_FIELDS = frozenset({"target_tokens"})


class WireError(ValueError):
    """A request the SDK could have sent but this server cannot read; the message names the field."""


@dataclass
class WireDatum:
    """One datum of a ``forward_backward``: its input tokens and its loss inputs as flat numpy arrays."""

    tokens: list[int]
    loss_fn_inputs: dict[str, Any] = field(default_factory=dict)


@dataclass
class WireForwardBackward:
    """A decoded ``/api/v1/forward_backward`` body."""

    model_id: str
    seq_id: int
    loss_fn: str
    loss_fn_config: dict[str, float | str]
    forward_only: bool
    data: list[WireDatum]


def _schema() -> Any:
    from tinker.proto import tinker_public_pb2

    return tinker_public_pb2


def decode_forward_backward(body: bytes, content_encoding: str | None) -> WireForwardBackward:
    """The request body as a :class:`WireForwardBackward`; a body that is not the SDK's message is a WireError."""
    from google.protobuf.message import DecodeError

    if content_encoding == "zstd":  # only when the server's client config asks the SDK to compress
        import zstandard

        body = zstandard.ZstdDecompressor().decompress(body)
    schema = _schema()
    message = schema.ForwardBackwardRequest()
    try:
        message.ParseFromString(body)
    except DecodeError as exc:
        raise WireError(f"the forward_backward body is not a ForwardBackwardRequest message: {exc}") from None
    config: dict[str, float | str] = {key: value for key, value in message.loss_fn_config.items()}
    for key, value in message.loss_fn_config_v2.items():  # the SDK writes both maps; the newer one carries strings
        config[key] = value.text if value.WhichOneof("value") == "text" else value.number
    data = [_decode_datum(schema, datum, index) for index, datum in enumerate(message.data)]
    return WireForwardBackward(message.model_id, message.seq_id, message.loss_fn, config, message.forward_only, data)


def _decode_datum(schema: Any, datum: Any, index: int) -> WireDatum:
    import numpy as np

    tokens: list[int] = []
    for chunk in datum.model_input:
        kind = chunk.WhichOneof("chunk")
        if kind != "encoded_text":
            raise WireError(
                f"data[{index}].model_input: a {kind} chunk; this server trains on token chunks only "
                "(types.ModelInput.from_ints)"
            )
        tokens += np.frombuffer(chunk.encoded_text.tokens, dtype=np.int32).tolist()
    inputs = {}
    for name, tensor in datum.loss_fn_inputs.items():
        if tensor.HasField("sparse_csr"):
            raise WireError(f"data[{index}].loss_fn_inputs[{name!r}]: a sparse tensor; send it dense (a 1-D array)")
        dtype = {schema.DTYPE_FLOAT32: np.float32, schema.DTYPE_INT64: np.int64}.get(tensor.dtype)
        if dtype is None:
            raise WireError(f"data[{index}].loss_fn_inputs[{name!r}]: dtype {tensor.dtype} is neither float32 nor int64")
        values = np.frombuffer(tensor.dense, dtype=dtype)
        if len(tensor.shape) > 1:
            raise WireError(
                f"data[{index}].loss_fn_inputs[{name!r}]: shape {list(tensor.shape)}; every loss input "
                "is one value per input token, a 1-D array"
            )
        inputs[name] = values.astype(np.int64 if name in TOKEN_FIELDS else np.float32)
    return WireDatum(tokens, inputs)


def encode_forward_backward_output(logprobs: list[Any], metrics: dict[str, float]) -> bytes:
    """``ForwardBackwardOutput``: one ``logprobs`` float32 array per datum (the target tokens' log-probs), and the
    metrics; the arrays travel as one batched tensor with a byte offset per datum, as the SDK reads them."""
    import numpy as np

    schema = _schema()
    message = schema.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord", metrics=metrics)
    arrays = [np.asarray(values, dtype=np.float32) for values in logprobs]
    offsets = np.cumsum([0] + [array.nbytes for array in arrays], dtype=np.int64)
    record = message.loss_fn_outputs.add(num_datums=len(arrays))
    batched = record.fields["logprobs"]
    batched.data = b"".join(array.tobytes() for array in arrays)
    batched.offsets = offsets.tobytes()
    batched.dtype = schema.DTYPE_FLOAT32
    return message.SerializeToString()


@dataclass
class SampledSequence:
    """One sample: its tokens, each token's log-prob under the model, and why it stopped (``stop`` or ``length``)."""

    tokens: list[int]
    logprobs: list[float]
    stop_reason: str


def encode_sample_response(sequences: list[SampledSequence], prompt_logprobs: list[float] | None) -> bytes:
    """``SampleResponse``; a prompt position without a log-prob (the first, or one before ``prompt_logprobs_last_n``)
    is NaN, which the SDK reads as None."""
    import numpy as np

    schema = _schema()
    stop = {"stop": schema.STOP_REASON_STOP, "length": schema.STOP_REASON_LENGTH}
    message = schema.SampleResponse()
    for sequence in sequences:
        message.sequences.add(
            stop_reason=stop[sequence.stop_reason],
            tokens=np.asarray(sequence.tokens, dtype=np.int32).tobytes(),
            logprobs=np.asarray(sequence.logprobs, dtype=np.float32).tobytes(),
        )
    if prompt_logprobs is not None:
        message.prompt_logprobs = np.asarray(prompt_logprobs, dtype=np.float32).tobytes()
    return message.SerializeToString()
