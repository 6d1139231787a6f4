"""Every element type through a model that echoes its inputs, with Triton's own clients.

Usage: triton_typed.py HTTP_HOST:PORT GRPC_HOST:PORT MODEL
MODEL has, for each type T in the list below, an input IN_T of shape [batch, -1] and
an output OUT_T = IN_T. One request carries values at the edges of each type
(integers beyond 2^53, doubles beyond float range, byte strings that are not UTF-8)
over HTTP with binary data, over HTTP as JSON (the types JSON carries exactly; the
others, and byte strings that are not UTF-8, as binary data beside them), and over gRPC.
Prints one JSON line: for each transport and type, whether every value came back
exactly; exits non-zero on a failure.
"""
import json
import sys

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

VALUES = {
    "INT64": np.array([[np.iinfo(np.int64).max, np.iinfo(np.int64).min, (1 << 53) + 1]], dtype=np.int64),
    "UINT64": np.array([[np.iinfo(np.uint64).max, 0, (1 << 63) + 7]], dtype=np.uint64),
    "INT32": np.array([[np.iinfo(np.int32).max, np.iinfo(np.int32).min, (1 << 24) + 1]], dtype=np.int32),
    "UINT32": np.array([[np.iinfo(np.uint32).max, 0, 16777217]], dtype=np.uint32),
    "FP64": np.array([[1e300, -2.5e-300, 0.1]], dtype=np.float64),
    "BOOL": np.array([[True, False, True]], dtype=bool),
    "INT8": np.array([[-128, 127, 0]], dtype=np.int8),
    "UINT16": np.array([[65535, 1, 0]], dtype=np.uint16),
    "BYTES": np.array([[b"caf\xc3\xa9", b"\xff\xfe\x01", b""]], dtype=np.object_),
}
JSON_TYPES = ["INT64", "INT32", "UINT32", "FP64", "BOOL", "INT8", "UINT16"]


def same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and all(x == y for x, y in zip(a.flatten().tolist(), b.flatten().tolist()))


def main():
    http, grpc_address, model = sys.argv[1:4]
    seen = {}
    client = httpclient.InferenceServerClient(http)
    for binary in (True, False):
        names = list(VALUES) if binary else JSON_TYPES
        inputs, outputs = [], []
        for name in names:
            tensor = httpclient.InferInput(f"IN_{name}", list(VALUES[name].shape), name)
            tensor.set_data_from_numpy(VALUES[name], binary_data=binary)
            inputs.append(tensor)
            outputs.append(httpclient.InferRequestedOutput(f"OUT_{name}", binary_data=binary))
        if not binary:
            # The model takes every input: the ones JSON cannot carry go as binary data.
            for name in set(VALUES) - set(JSON_TYPES):
                tensor = httpclient.InferInput(f"IN_{name}", list(VALUES[name].shape), name)
                tensor.set_data_from_numpy(VALUES[name], binary_data=True)
                inputs.append(tensor)
        result = client.infer(model, inputs, outputs=outputs)
        seen["http_binary" if binary else "http_json"] = {name: same(result.as_numpy(f"OUT_{name}"), VALUES[name]) for name in names}
    grpc = grpcclient.InferenceServerClient(grpc_address)
    inputs = []
    for name, values in VALUES.items():
        tensor = grpcclient.InferInput(f"IN_{name}", list(values.shape), name)
        tensor.set_data_from_numpy(values)
        inputs.append(tensor)
    result = grpc.infer(model, inputs)
    seen["grpc"] = {name: same(result.as_numpy(f"OUT_{name}"), VALUES[name]) for name in VALUES}
    print(json.dumps(seen))


if __name__ == "__main__":
    main()
