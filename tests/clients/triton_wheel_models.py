"""Two real ONNX models from the onnx wheel's backend node tests, with Triton's clients.

Usage: triton_wheel_models.py HTTP_HOST:PORT GRPC_HOST:PORT MAX_MODEL SPLIT_MODEL MOD_MODEL
MAX_MODEL is test_max_int64 (result = max(data_0, data_1), INT64 [3] each); SPLIT_MODEL is
test_split_equal_parts_2d (input FP32 [2, 6] into output_1 and output_2, FP32 [2, 3]);
MOD_MODEL is test_mod_mixed_sign_int64 (z = x mod y, INT64 [6] each).
Each model gets one request over HTTP with binary data, over HTTP as JSON (the INT64
model only: JSON has no NaN or infinity) and over gRPC. Prints one JSON line: for each
model, the inputs sent and, for each transport, each output's shape and bytes (hex),
for the test to compare with a plain ONNX Runtime run of the same inputs.
"""
import json
import sys

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient


def max_inputs():
    # Each pair differs by one in its last bit yet is the same number as a double
    # (2^53 + 1 and 2^53, -(2^62) - 1 and -(2^62)) or as a float (2^24 + 1 and 2^24).
    data_0 = np.array([(1 << 53) + 1, -(1 << 62) - 1, (1 << 24) + 1], dtype=np.int64)
    data_1 = np.array([1 << 53, -(1 << 62), 1 << 24], dtype=np.int64)
    return {"data_0": ("INT64", data_0), "data_1": ("INT64", data_1)}


def mod_inputs():
    # Mixed signs, and values only an exact 64-bit integer holds.
    x = np.array([-(1 << 62) - 1, (1 << 53) + 1, 7, -7, (1 << 40) + 3, 5], dtype=np.int64)
    y = np.array([3, -4, -3, 3, (1 << 24) + 1, 8], dtype=np.int64)
    return {"x": ("INT64", x), "y": ("INT64", y)}


def split_inputs():
    row0 = [0.1, -0.0, 1e-45, 3.4e38, float("inf"), float("nan")]
    row1 = [-2.5, 1e-3, -1e-38, 16777217.0, -float("inf"), 7.0]
    return {"input": ("FP32", np.array([row0, row1], dtype=np.float32))}


def described(array):
    return {"shape": list(array.shape), "hex": array.tobytes().hex()}


def infer(client, module, model, inputs, outputs, binary):
    tensors = []
    for name, (datatype, array) in inputs.items():
        tensor = module.InferInput(name, list(array.shape), datatype)
        if module is httpclient:
            tensor.set_data_from_numpy(array, binary_data=binary)
        else:
            tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    if module is httpclient:
        requested = [module.InferRequestedOutput(name, binary_data=binary) for name in outputs]
    else:
        requested = [module.InferRequestedOutput(name) for name in outputs]
    result = client.infer(model, tensors, outputs=requested)
    return {name: described(result.as_numpy(name)) for name in outputs}


def main():
    http, grpc_address, max_model, split_model, mod_model = sys.argv[1:6]
    http_client = httpclient.InferenceServerClient(http)
    grpc_client = grpcclient.InferenceServerClient(grpc_address)
    cases = [
        ("max", max_model, max_inputs(), ["result"], True),
        ("split", split_model, split_inputs(), ["output_1", "output_2"], False),
        ("mod", mod_model, mod_inputs(), ["z"], True),
    ]
    seen = {}
    for key, model, inputs, outputs, json_too in cases:
        entry = {"inputs": {name: described(array) for name, (_, array) in inputs.items()}}
        entry["http_binary"] = infer(http_client, httpclient, model, inputs, outputs, True)
        if json_too:
            entry["http_json"] = infer(http_client, httpclient, model, inputs, outputs, False)
        entry["grpc"] = infer(grpc_client, grpcclient, model, inputs, outputs, True)
        seen[key] = entry
    print(json.dumps(seen))


if __name__ == "__main__":
    main()
