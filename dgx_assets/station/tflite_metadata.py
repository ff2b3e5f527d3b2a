"""The edge contract inside the .tflite file itself, as a named metadata entry of the flatbuffer.

A device that has only `model.tflite` still knows its format, classes, raw input size and decision threshold:
the runtime reads them from the model, never from a file name. TFLite's schema has a `metadata` list of
(name, buffer) pairs for exactly this (the converter writes its own `min_runtime_version` there); the schema
module ships with ai-edge-litert, so reading needs nothing the edge install lacks.
"""

from __future__ import annotations

import json

CONTRACT_NAME = "dgx_edge_contract"
_FILE_IDENTIFIER = b"TFL3"
MAX_CONTRACT_BYTES = 1 << 20  # a contract is a few hundred bytes; more is not ours


class MetadataError(ValueError):
    """The model file carries no readable contract; the message says why."""


def embed_contract(tflite_model: bytes, contract: dict) -> bytes:
    """The model with `contract` (JSON) as its `dgx_edge_contract` metadata entry, replacing an earlier one."""
    import flatbuffers
    from ai_edge_litert import schema_py_generated as schema

    model = schema.ModelT.InitFromPackedBuf(bytearray(tflite_model), 0)
    model.metadata = [entry for entry in (model.metadata or []) if _name(entry.name) != CONTRACT_NAME]
    buffer = schema.BufferT()
    buffer.data = list(json.dumps(contract, sort_keys=True).encode())
    model.buffers = model.buffers or []  # the schema lets a model have none
    model.buffers.append(buffer)
    entry = schema.MetadataT()
    entry.name = CONTRACT_NAME
    entry.buffer = len(model.buffers) - 1
    model.metadata.append(entry)
    builder = flatbuffers.Builder(len(tflite_model) + 4096)
    builder.Finish(model.Pack(builder), file_identifier=_FILE_IDENTIFIER)
    return bytes(builder.Output())


def read_contract(tflite_model: bytes) -> dict:
    """The contract embedded by `embed_contract`, read without unpacking the model's weights."""
    from ai_edge_litert import schema_py_generated as schema

    try:
        model = schema.Model.GetRootAs(tflite_model, 0)
        for index in range(model.MetadataLength()):
            entry = model.Metadata(index)
            assert entry is not None  # None only past MetadataLength()
            if _name(entry.Name()) != CONTRACT_NAME:
                continue
            buffer = model.Buffers(entry.Buffer())
            if buffer is None or not 0 < buffer.DataLength() <= MAX_CONTRACT_BYTES:
                raise MetadataError(f"the model's {CONTRACT_NAME} entry is missing its data or over {MAX_CONTRACT_BYTES} bytes")
            # DataLength() > 0, so an array (flatbuffers gives 0 for no data)
            contract = json.loads(buffer.DataAsNumpy().tobytes())  # pyright: ignore[reportAttributeAccessIssue]
            if not isinstance(contract, dict):
                raise MetadataError(f"the model's {CONTRACT_NAME} entry is not a JSON object")
            return contract
    except MetadataError:
        raise
    except Exception as error:  # flatbuffers raises IndexError, struct.error... on a damaged file
        raise MetadataError(f"not a readable TFLite model ({type(error).__name__}: {error})") from error
    raise MetadataError(f"the model has no {CONTRACT_NAME} metadata: it was not built by edge_model")


def read_contract_file(path) -> dict:
    """`read_contract` of a .tflite file, read whole: edge models are a few MB."""
    with open(path, "rb") as handle:
        return read_contract(handle.read())


def _name(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value or "")
