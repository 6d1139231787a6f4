"""Triton's trace extension with Triton's own Python clients.

Usage: triton_trace.py HTTP_HOST:PORT GRPC_HOST:PORT MODEL
Reads the trace settings over HTTP (off), turns tracing on over HTTP for every request
(trace_rate 1) and three traces (trace_count 3), infers five times (over HTTP and
gRPC), reads the settings back over gRPC (no traces left), sets MODEL's own rate over
gRPC and reads the server's and the model's settings, then tries settings the server
refuses (another trace file; the TENSORS level). MODEL takes one FP32 input x of shape
[batch, 4]. Prints one JSON line with what it saw; exits non-zero on any failure.
"""
import json
import sys

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException


def main():
    http_address, grpc_address, model = sys.argv[1:4]
    http = httpclient.InferenceServerClient(http_address)
    grpc = grpcclient.InferenceServerClient(grpc_address)
    seen = {"initial": http.get_trace_settings()}
    seen["on"] = http.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"], "trace_rate": "1", "trace_count": "3"})
    x = np.array([[1, 2, 3, 4]], dtype=np.float32)
    for i in range(5):
        if i % 2 == 0:
            tensor = httpclient.InferInput("x", [1, 4], "FP32")
            tensor.set_data_from_numpy(x)
            http.infer(model, [tensor])
        else:
            tensor = grpcclient.InferInput("x", [1, 4], "FP32")
            tensor.set_data_from_numpy(x)
            grpc.infer(model, [tensor])
    seen["after"] = grpc.get_trace_settings(as_json=True)
    seen["model_set"] = grpc.update_trace_settings(model_name=model, settings={"trace_rate": "7"}, as_json=True)
    seen["model_read"] = http.get_trace_settings(model_name=model)
    seen["server_read"] = http.get_trace_settings()
    for name, settings in [("refused_file", {"trace_file": "/tmp/elsewhere.json"}), ("refused_tensors", {"trace_level": ["TENSORS"]})]:
        try:
            http.update_trace_settings(settings=settings)
            seen[name] = None
        except InferenceServerException as error:
            seen[name] = error.message()
    print(json.dumps(seen))


if __name__ == "__main__":
    main()
