"""Client batches with Triton's own clients: one request carries N items.

Usage: triton_batches.py HTTP_HOST:PORT GRPC_HOST:PORT MODEL N [N ...]
MODEL has inputs IN_INT64 INT64 [batch, 3], IN_FP32 FP32 [batch, 4] and IN_BYTES
BYTES [batch, 2]. For each N, one request of N rows (values that differ from row to
row: integers beyond 2^53, fractions, byte strings that are not UTF-8) goes over HTTP
(binary data) and over gRPC. Prints one JSON line: for each transport and N, the inputs
sent and each output's shape, datatype and bytes (hex; BYTES as Triton's binary layout),
for the test to compare with a plain ONNX Runtime run of the same inputs.
"""
import json
import struct
import sys

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

OUTPUTS = ["OUT_INT64", "OUT_FP32", "OUT_BYTES"]


def inputs_for(n):
    rows = np.arange(n, dtype=np.int64).reshape(n, 1)
    ints = (1 << 53) + 3 * rows + np.array([[1, -(1 << 40), 7]], dtype=np.int64)
    floats = (rows.astype(np.float32) + np.array([[0.1, -2.5, 1e-3, 3.0e7]], dtype=np.float32)).astype(np.float32)
    # Not UTF-8, and no NUL byte (ONNX Runtime's strings cannot hold one).
    strings = np.array([[f"row{i}".encode(), b"\xff\xfe" + bytes([i + 1])] for i in range(n)], dtype=np.object_)
    return {"IN_INT64": ints, "IN_FP32": floats, "IN_BYTES": strings}


def layout(array):
    """A numpy array's bytes as the server carries them (BYTES: length-prefixed)."""
    if array.dtype == np.object_:
        return b"".join(struct.pack("<I", len(s)) + s for s in array.flatten().tolist())
    return array.tobytes()


def described(array):
    return {"shape": list(array.shape), "hex": layout(array).hex()}


def main():
    http, grpc_address, model = sys.argv[1:4]
    sizes = [int(n) for n in sys.argv[4:]]
    types = {"IN_INT64": "INT64", "IN_FP32": "FP32", "IN_BYTES": "BYTES"}
    seen = {"http": {}, "grpc": {}, "inputs": {}}
    http_client = httpclient.InferenceServerClient(http)
    grpc_client = grpcclient.InferenceServerClient(grpc_address)
    for n in sizes:
        values = inputs_for(n)
        seen["inputs"][str(n)] = {name: described(v) for name, v in values.items()}
        for transport, module, client in (("http", httpclient, http_client), ("grpc", grpcclient, grpc_client)):
            tensors = []
            for name, array in values.items():
                tensor = module.InferInput(name, list(array.shape), types[name])
                tensor.set_data_from_numpy(array)
                tensors.append(tensor)
            outputs = [module.InferRequestedOutput(name) for name in OUTPUTS]
            result = client.infer(model, tensors, outputs=outputs)
            seen[transport][str(n)] = {name: described(result.as_numpy(name)) for name in OUTPUTS}
    print(json.dumps(seen))


if __name__ == "__main__":
    main()
